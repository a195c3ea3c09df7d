"""Quality: quantized weights against the model they came from, on real text."""
