// How many of its team's threads a decode step uses. With as many threads as cores and another
// program busy on one of them, the thread that shares a core with it is descheduled for whole time
// slices (as long as a small model's step) while it holds a chunk, and every stage after waits for
// that chunk: beside a busy core, one thread fewer decodes faster (docs/performance-choices.md).
// So every so many steps a try of two steps runs on one thread fewer (or one more, back towards
// the team's size), and the second's time is compared with a running mean of the steps just before
// of as many tokens (alike in depth and rows, whatever the machine does over minutes). A running
// mean of those log time ratios that shows a clear gain switches; a loss makes that way's tries
// rarer. A free machine pays a few tries early in a reply, then one every kLongestInterval steps.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

class ThreadChoice {
  public:
    // Steps between tries: at first, then at most after a loss of over 35 % (kBig: 2 threads against
    // 1 on a free machine), and after a smaller one (1 against 2 beside a busy core, which stops
    // being one when the other program does)
    static constexpr int kFirstInterval = 16, kLongestInterval = 256, kMildInterval = 64;
    static constexpr int kTrySteps = 2;  // a try's steps; the last one counts (the first lets the scheduler
                                         // move the caller to a free core, where the team's others ran)
    static constexpr int kBaseSteps = 4;  // steps on the threads in use before a try is compared with them
    static constexpr int kTriesToDecide = 2;
    static constexpr double kClear = 0.05;  // a mean log ratio beyond +-5 %: a clear gain or loss
    static constexpr double kBig = 0.3;  // a loss of over 35 %
    static constexpr double kWeight = 0.3;  // of the newest in a running mean

    explicit ThreadChoice(int most) : most_(std::max(1, most)), now_(most_) {}

    int now() const { return now_; }

    // Threads for the next step, of `tokens` tokens
    int next(int64_t tokens) {
        if (tokens != tokens_ || based_ < kBaseSteps) return now_;
        if (trying_ > 0) return trying_threads_;
        for (int k = 0; k < 2; ++k) {  // the way not tried last first
            const int way = turn_ ^ k, t = now_ + (way ? 1 : -1);
            if (t >= 1 && t <= most_ && since_ >= way_[way].interval) {
                trying_ = kTrySteps, trying_threads_ = t;
                return t;
            }
        }
        return now_;
    }

    // A step of `tokens` tokens on `threads` threads took `seconds`
    void took(int64_t tokens, int threads, double seconds) {
        if (!(seconds > 0)) return;
        if (threads == now_) {  // into the running mean of the steps of as many tokens
            if (tokens != tokens_) tokens_ = tokens, based_ = 0, trying_ = 0;
            base_ = based_++ ? (1 - kWeight) * base_ + kWeight * seconds : seconds;
            ++since_;
            return;
        }
        if (tokens != tokens_ || trying_ == 0 || threads != trying_threads_ || --trying_ > 0) return;
        Way& w = way_[threads > now_];
        const double r = std::log(seconds / base_);
        if (w.mean > kClear && r < -kClear) w = Way{};  // a gain after losses (a program beside it began): start over
        w.mean = w.tries++ ? (1 - kWeight) * w.mean + kWeight * r : r;
        since_ = 0;
        turn_ = threads < now_;  // the other way next
        if (w.mean > kClear) {  // a loss: tried less often
            w.interval = w.mean > kBig ? std::min(8 * w.interval, kLongestInterval) : std::min(2 * w.interval, kMildInterval);
        } else if (w.mean < -kClear && w.tries >= kTriesToDecide) {  // a gain: switch, both ways start over
            now_ = threads;
            tokens_ = -1;
            way_[0] = way_[1] = Way{};
        }
    }

  private:
    struct Way {  // tries of one thread fewer (0) or more (1)
        int interval = kFirstInterval;
        int tries = 0;
        double mean = 0;  // running mean of log(a try's time / base_)
    };
    const int most_;
    int now_;
    int turn_ = 0;  // the way to try next, if its interval has passed
    int trying_ = 0, trying_threads_ = 0;  // steps of the try under way left, and its threads
    int64_t since_ = 0;  // steps on now_ threads since the last try
    int64_t tokens_ = -1;  // the tokens of the steps in base_
    int64_t based_ = 0;  // steps in base_
    double base_ = 0;  // running mean of a step's time on now_ threads
    Way way_[2];
};
