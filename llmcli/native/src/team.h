// The kernels' threads. A job is a list of stages (rows of a projection, heads of attention); each
// stage's items are cut into chunks, each thread's share a contiguous range that it takes first and
// the others take what is left of, and the thread that finishes a stage's last work runs its serial
// `then` (a norm, a quantization) and opens the next one.
//
// Nothing waits for a particular thread, only for chunks in progress: with more threads than free
// CPUs (another program busy on one core), a descheduled thread holds up the others only while it
// holds a chunk, not at every stage as at a barrier. Waits spin for a few microseconds (a stage
// usually opens within that), then sleep on a condition variable, so that a waiting thread gives its
// CPU to the one it waits for.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "isa.h"

// A counter threads wait on to pass a value
class Gate {
  public:
    int64_t value() const { return v_.load(std::memory_order_acquire); }

    void set(int64_t x) {
        v_.store(x, std::memory_order_seq_cst);
        if (sleepers_.load(std::memory_order_seq_cst) > 0) {  // seq_cst on both sides: a sleeper that missed x is notified
            std::lock_guard<std::mutex> g(m_);
            cv_.notify_all();
        }
    }

    // Returns once value() > x: spins for `spin_us`, then sleeps
    void wait_above(int64_t x, int spin_us) {
        if (value() > x) return;
        const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us);
        for (int i = 1;; ++i) {
            cpu_relax();
            if (value() > x) return;
            if (i % 32 == 0 && std::chrono::steady_clock::now() > until) break;
        }
        std::unique_lock<std::mutex> lk(m_);
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        cv_.wait(lk, [&] { return v_.load(std::memory_order_seq_cst) > x; });
        sleepers_.fetch_sub(1, std::memory_order_relaxed);
    }

  private:
    std::atomic<int64_t> v_{0};
    std::atomic<int> sleepers_{0};
    std::mutex m_;
    std::condition_variable cv_;
};

struct Stage {
    int64_t n = 0;      // items
    int64_t align = 1;  // chunks are multiples of this
    std::function<void(int thread, int64_t lo, int64_t hi)> work;
    std::function<void()> then;  // run once, after every item, before the next stage opens (may be empty)
};

class Team {
  public:
    static constexpr int kStageSpinUs = 50;  // a stage's last chunks take microseconds
    // Between jobs, workers sleep at once: torch's own threads run the ops between our calls, and a
    // worker spinning beside them took a core they needed (eager steps on 2 threads and 2 cores of a
    // busy machine were much slower with workers that spin first: docs/performance-choices.md)
    static constexpr int kIdleSpinUs = 0;

    explicit Team(int n) : n_(std::max(1, n)) {
        for (int i = 1; i < n_; ++i) workers_.emplace_back([this, i] { serve(i); });
    }

    ~Team() {
        stop_.store(true);
        jobs_.set(jobs_.value() + 1);
        for (auto& t : workers_) t.join();
    }

    int size() const { return n_; }

    // Every stage in order, on the team's first `threads` threads (all: 0; the caller is thread 0);
    // returns when all are done
    void run(std::vector<Stage>& stages, int threads = 0) {
        if (stages.empty()) return;
        std::lock_guard<std::mutex> one_at_a_time(run_);
        const int active = threads > 0 ? std::min(threads, n_) : n_;
        if (active == 1) {  // no job to share: a microsecond less a call
            for (auto& s : stages) {
                if (s.n) s.work(0, 0, s.n);
                if (s.then) s.then();
            }
            return;
        }
        auto job = std::make_shared<Job>(stages, active);
        open_empty(*job, 0);
        { std::lock_guard<std::mutex> g(job_m_); current_ = job; }
        jobs_.set(jobs_.value() + 1);
        work_on(*job, 0);
        job->open.wait_above((int64_t)stages.size(), kStageSpinUs);
    }

  private:
    // One run's progress. Workers late for a job hold it by shared_ptr: they find every stage handed
    // out and leave without touching `stages` (the caller's, gone by then).
    // Each stage's chunks are split into one contiguous range a thread: a thread takes the chunks of
    // its own range first, then those left in the others' (so a descheduled thread's range is done
    // by the rest), and counts what it did into `done` once, when it finds no chunk left. Every
    // chunk through one counter that both cores wrote, twice, moved its cache line between the cores
    // at every chunk, and a batch's step has thousands of chunks.
    struct alignas(64) Range { std::atomic<int64_t> next{0}; int64_t end = 0; };
    struct Job {
        Stage* stages;
        int64_t count;
        int threads;
        std::unique_ptr<int64_t[]> n, chunk;
        std::unique_ptr<Range[]> ranges;  // stage s, thread t's: [s * threads + t], in chunks
        std::unique_ptr<std::atomic<int64_t>[]> done;
        Gate open;  // stage s may be worked on once open.value() > s; > count: all done

        Job(std::vector<Stage>& s, int threads)
            : stages(s.data()), count((int64_t)s.size()), threads(threads), n(new int64_t[s.size()]),
              chunk(new int64_t[s.size()]), ranges(new Range[s.size() * threads]), done(new std::atomic<int64_t>[s.size()]) {
            for (int64_t i = 0; i < count; ++i) {
                const int64_t a = std::max<int64_t>(1, s[i].align);
                n[i] = s[i].n;  // about eight chunks a thread: fewer left threads idle at the end of a stage
                chunk[i] = std::max<int64_t>(1, (s[i].n + 8 * threads * a - 1) / (8 * threads * a)) * a;
                const int64_t chunks = (n[i] + chunk[i] - 1) / chunk[i];
                for (int t = 0; t < threads; ++t) {
                    ranges[i * threads + t].next.store(chunks * t / threads, std::memory_order_relaxed);
                    ranges[i * threads + t].end = chunks * (t + 1) / threads;
                }
                done[i].store(0, std::memory_order_relaxed);
            }
        }
    };

    // Opens stage s, running the `then` of any empty stages from s on
    static void open_empty(Job& job, int64_t s) {
        while (s < job.count && job.n[s] == 0) {
            if (job.stages[s].then) job.stages[s].then();
            ++s;
        }
        job.open.set(s + 1);
    }

    void work_on(Job& job, int t) {
        for (int64_t s = std::max<int64_t>(0, job.open.value() - 1); s < job.count; ++s) {
            job.open.wait_above(s, kStageSpinUs);
            const int64_t n = job.n[s], chunk = job.chunk[s];
            int64_t mine = 0;
            for (int k = 0; k < job.threads; ++k) {  // its own range, then what is left of the others'
                Range& r = job.ranges[s * job.threads + (t + k) % job.threads];
                for (int64_t c; (c = r.next.fetch_add(1, std::memory_order_relaxed)) < r.end;) {
                    const int64_t lo = c * chunk, hi = std::min(n, lo + chunk);
                    job.stages[s].work(t, lo, hi);  // the job is alive: this stage is not done
                    mine += hi - lo;
                }
            }
            if (mine && job.done[s].fetch_add(mine, std::memory_order_acq_rel) + mine == n) {
                if (job.stages[s].then) job.stages[s].then();
                open_empty(job, s + 1);
            }
        }
    }

    void serve(int t) {
        int64_t seen = 0;
        for (;;) {
            jobs_.wait_above(seen, kIdleSpinUs);
            seen = jobs_.value();
            if (stop_.load()) return;
            std::shared_ptr<Job> job;
            { std::lock_guard<std::mutex> g(job_m_); job = current_; }
            if (job && t < job->threads) work_on(*job, t);
        }
    }

    const int n_;
    std::vector<std::thread> workers_;
    std::mutex run_, job_m_;
    std::shared_ptr<Job> current_;
    Gate jobs_;  // jobs started
    std::atomic<bool> stop_{false};
};
