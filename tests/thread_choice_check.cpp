// ThreadChoice (thread_choice.h) on made-up step times, and Team::run on some of its threads
// (team.h). Prints "ok", or what failed. Built and run by tests/test_thread_choice.py.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <mutex>
#include <set>
#include <vector>

#include "team.h"
#include "thread_choice.h"

static int failures = 0;
#define CHECK(cond, ...) do { if (!(cond)) { ++failures; std::printf("FAIL line %d: ", __LINE__); std::printf(__VA_ARGS__); std::printf("\n"); } } while (0)

// A step's time on t threads: `cost(step, t)` times noise within +-`noise` (a fixed sequence)
struct Machine {
    std::function<double(int step, int threads)> cost;
    double noise = 0.05;
    uint32_t seed = 12345;
    double operator()(int step, int t) {
        seed = seed * 1664525u + 1013904223u;
        return cost(step, t) * (1 + noise * ((seed >> 8) / double(1 << 24) * 2 - 1));
    }
};

struct Run {
    std::vector<int> chosen;  // threads a step, in order
    int now_at_end = 0;
};

static Run decode(int most, int steps, Machine m, int64_t tokens = 1, bool tokens_change = false) {
    ThreadChoice c(most);
    Run r;
    for (int s = 0; s < steps; ++s) {
        const int64_t n = tokens_change ? 1 + s % 8 : tokens;
        const int t = c.next(n);
        r.chosen.push_back(t);
        c.took(n, t, m(s, t));
    }
    r.now_at_end = c.now();
    return r;
}

static int count(const std::vector<int>& v, int from, int to, int threads) {
    int k = 0;
    for (int i = from; i < to; ++i) k += v[i] == threads;
    return k;
}

int main() {
    // A free machine: 2 threads 1.7x faster than 1. Tries of 1 thread only, and few of them.
    {
        Run r = decode(2, 2000, Machine{[](int, int t) { return t == 2 ? 1.0 : 1.7; }});
        CHECK(r.now_at_end == 2, "free: ended on %d threads", r.now_at_end);
        CHECK(count(r.chosen, 0, 2000, 2) + count(r.chosen, 0, 2000, 1) == 2000, "free: a count other than 1 or 2");
        const int ones = count(r.chosen, 0, 256, 1), later = count(r.chosen, 256, 2000, 1);
        CHECK(ones >= 2 && ones <= 6, "free: %d one-thread steps in the first 256", ones);
        CHECK(later <= 2 * (1744 / ThreadChoice::kLongestInterval + 1), "free: %d one-thread steps after", later);
    }
    // One core busy: 1 thread 1.2x faster than 2, with 20 % noise. Switches within ~60 steps and stays.
    {
        Run r = decode(2, 1000, Machine{[](int, int t) { return t == 1 ? 1.0 : 1.2; }, 0.2});
        int first_one = -1;
        for (int s = 0; s + 8 < 1000 && first_one < 0; ++s)
            if (count(r.chosen, s, s + 8, 1) == 8) first_one = s;
        CHECK(first_one >= 0 && first_one < 80, "busy: 8 one-thread steps in a row first at %d", first_one);
        CHECK(r.now_at_end == 1, "busy: ended on %d threads", r.now_at_end);
        CHECK(count(r.chosen, 200, 1000, 2) < 80, "busy: %d two-thread steps of 800 after switching", count(r.chosen, 200, 1000, 2));
    }
    // The busy program stops after 300 steps: back to 2 threads
    {
        Run r = decode(2, 1300, Machine{[](int s, int t) { return s < 300 ? (t == 1 ? 1.0 : 1.2) : (t == 2 ? 1.0 : 1.7); }});
        CHECK(count(r.chosen, 250, 300, 1) > 40, "comes and goes: %d one-thread steps of 50 while busy", count(r.chosen, 250, 300, 1));
        CHECK(r.now_at_end == 2 && count(r.chosen, 500, 1300, 2) > 780, "comes and goes: ended on %d, %d two-thread steps of 800",
              r.now_at_end, count(r.chosen, 500, 1300, 2));
    }
    // ... and a busy program that starts after 600 steps of a free machine is found within ~3 long intervals
    {
        Run r = decode(2, 2000, Machine{[](int s, int t) { return s < 600 ? (t == 2 ? 1.0 : 1.7) : (t == 1 ? 1.0 : 1.2); }});
        CHECK(r.now_at_end == 1 && count(r.chosen, 1500, 2000, 1) > 450, "starts later: ended on %d, %d one-thread steps of 500",
              r.now_at_end, count(r.chosen, 1500, 2000, 1));
    }
    // 4 threads, 3 the fastest (a core taken): it walks down to 3 and no further
    {
        Run r = decode(4, 2000, Machine{[](int, int t) { return t == 3 ? 1.0 : t == 4 ? 1.25 : t == 2 ? 1.3 : 2.2; }});
        CHECK(r.now_at_end == 3 && count(r.chosen, 1000, 2000, 3) > 950, "4 threads: ended on %d, %d on 3 of the last 1000",
              r.now_at_end, count(r.chosen, 1000, 2000, 3));
    }
    // Steps of ever other sizes (nothing to compare a try with): all threads, no tries
    {
        Run r = decode(2, 500, Machine{[](int, int t) { return t == 1 ? 1.0 : 1.2; }}, 1, true);
        CHECK(count(r.chosen, 0, 500, 2) == 500, "sizes change: %d steps on fewer threads", 500 - count(r.chosen, 0, 500, 2));
    }
    // One thread: nothing to choose
    {
        Run r = decode(1, 200, Machine{[](int, int) { return 1.0; }});
        CHECK(count(r.chosen, 0, 200, 1) == 200, "one thread: asked for more");
    }

    // Team::run on k of its 3 threads: every item done once, by threads below k only, each stage
    // after the one before, and the serial `then`s in order
    {
        Team team(3);
        for (int k = 0; k <= 4; ++k) {
            const int active = k == 0 || k > 3 ? 3 : k;
            std::vector<int> done(1000, 0);
            std::vector<int> order;
            std::set<int> who;
            std::mutex m;
            std::vector<Stage> stages;
            for (int s = 0; s < 4; ++s) {
                stages.push_back({250, 8, [&, s](int t, int64_t lo, int64_t hi) {
                    std::lock_guard<std::mutex> g(m);
                    who.insert(t);
                    for (int64_t i = lo; i < hi; ++i) ++done[s * 250 + i];
                    for (int p = 0; p < s; ++p)  // every earlier stage finished
                        for (int i = 0; i < 250; ++i) if (done[p * 250 + i] != 1) { ++failures; return; }
                }, [&order, s] { order.push_back(s); }});
            }
            for (int rep = 0; rep < 20; ++rep) {
                std::fill(done.begin(), done.end(), 0);
                order.clear();
                team.run(stages, k);
                for (int i = 0; i < 1000; ++i) CHECK(done[i] == 1, "team on %d: item %d done %d times", k, i, done[i]);
                CHECK((order == std::vector<int>{0, 1, 2, 3}), "team on %d: thens out of order", k);
            }
            for (int t : who) CHECK(t < active, "team on %d: thread %d worked", k, t);
            who.clear();
        }
    }
    if (failures == 0) std::printf("ok\n");
    return failures != 0;
}
