"""Speed: tokens a second, time to first token, and where a step's time goes, each against a baseline in the same run."""
