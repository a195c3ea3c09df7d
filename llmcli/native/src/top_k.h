// The k largest of a row of floats, found in one pass that compares a vector at a time with a
// floor under the k-th largest, so that only a handful of values are looked at one by one. The
// values may come in pieces (a thread's chunks of a vocabulary, in any order); several
// finders' candidates for one row merge into its k largest (merge_into). Larger values first; of
// equal values the earlier one; NaN as the largest (torch.topk's order).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "vec.h"

class TopK {
  public:
    using Pair = std::pair<float, int64_t>;

    static float nan_last(float y) { return std::isnan(y) ? INFINITY : y; }  // NaN as the largest, as torch.topk

    // k >= 1; later values must beat `floor` (a value known to be at most the k-th largest; -inf: none)
    void reset(int64_t k, float floor = -INFINITY) {
        k_ = k;
        c_.clear();
        c_.reserve(cap() + kVW);
        thr_ = floor > -INFINITY ? std::nextafter(floor, -INFINITY) : -INFINITY;  // y > thr_: from the floor up
        filling_ = !(floor > -INFINITY);  // no floor: the first k values go in whatever they are (-inf too)
        seen_ = 0;
    }

    // x[lo, hi), indices lo.. (pieces that do not overlap; one before an earlier piece, which a
    // thread's chunks taken from another thread's range are, lets values equal to the k-th in)
    void offer(const float* x, int64_t lo, int64_t hi) {
        ties_ = lo < seen_;
        seen_ = std::max(seen_, hi);
        int64_t i = lo;
        for (; filling_ && i < hi; ++i) {
            c_.push_back({nan_last(x[i]), i});
            if ((int64_t)c_.size() == k_) thr_ = keep_best(), filling_ = false;
        }
        // the vectors' test, made again only when the threshold rises (look_at): values equal to the
        // k-th pass too in a piece before an earlier one, and -inf ties no vector test lets through
        bool all = false;
        float bar = thr_;
        const auto set_bar = [&] { all = ties_ && thr_ == -INFINITY; bar = ties_ && !all ? std::nextafter(thr_, -INFINITY) : thr_; };
        set_bar();
        for (; i + kVW <= hi; i += kVW) {
            if (!all && !vany_above(vload(x + i), bar)) continue;  // the usual case
            for (int j = 0; j < kVW; ++j) look_at(x, i + j);
            set_bar();
        }
        for (; i < hi; ++i) look_at(x, i);
    }

    // this finder's candidates into `all` (another finder's of the same row, merged by finish)
    void merge_into(TopK& all) const { all.c_.insert(all.c_.end(), c_.begin(), c_.end()); }

    // The k largest of what was offered (x: the row, for their values), largest first
    void finish(const float* x, float* values, int64_t* indices) {
        keep_best();
        for (int64_t j = 0; j < (int64_t)c_.size(); ++j) {
            values[j] = x[c_[j].second];
            indices[j] = c_[j].second;
        }
    }

  private:
    int64_t k_ = 1;
    float thr_ = -INFINITY;
    bool filling_ = true;
    int64_t seen_ = 0;   // the end of the pieces offered so far
    bool ties_ = false;  // this piece comes before an earlier one: its values equal to the k-th beat it (by index)
    std::vector<Pair> c_;

    int64_t cap() const { return 4 * k_ + 48; }
    static bool before(const Pair& a, const Pair& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); }

    void look_at(const float* x, int64_t i) {
        const float y = nan_last(x[i]);
        if (y > thr_ || (ties_ && y == thr_)) c_.push_back({y, i});
        if ((int64_t)c_.size() > cap()) thr_ = keep_best();
    }

    // keeps the k best (sorted), returns the k-th value: later values must beat it strictly (earlier ones equal it)
    float keep_best() {
        const int64_t k = std::min<int64_t>(k_, c_.size());
        std::partial_sort(c_.begin(), c_.begin() + k, c_.end(), before);
        c_.resize(k);
        return k == k_ ? c_.back().first : -INFINITY;
    }
};
