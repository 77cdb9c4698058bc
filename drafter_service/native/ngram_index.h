// One sequence's context and its n-gram index (drafter_service/ngram.py's NgramIndex with min_n = 1):
// each n-gram's latest end position, and a chain from each occurrence to the one before (same key).
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "evidence.h"
#include "tables.h"

namespace specd {

class NgramIndex {
public:
    explicit NgramIndex(int max_n) : max_n_(max_n) {}

    size_t size() const { return tokens_.size(); }
    const std::vector<int32_t>& tokens() const { return tokens_; }

    void extend(const int32_t* tokens, size_t count) {
        const size_t length = tokens_.size() + count;
        if (length > tokens_.capacity()) tokens_.reserve(std::max(length, 2 * tokens_.capacity()));
        if (length * max_n_ > previous_.capacity()) previous_.reserve(std::max(length * max_n_, 2 * previous_.capacity()));
        latest_.reserve(length * static_cast<size_t>(max_n_));  // at most max_n new n-grams a token
        for (size_t i = 0; i < count; ++i) append(tokens[i]);
    }

    // The n-grams ending at the old last token now have a continuation: index and chain them, then append.
    void append(int32_t token) {
        const size_t end = tokens_.size();
        previous_.resize((end + 1) * max_n_, 0);
        const int deepest = static_cast<int>(std::min<size_t>(max_n_, end));
        uint64_t chain = 0;
        for (int n = 1; n <= deepest; ++n) {
            chain = mix(chain, tokens_[end - n]);
            previous_[end * max_n_ + n - 1] = latest_.exchange(finish(chain, n), static_cast<uint32_t>(end));
        }
        tokens_.push_back(token);
    }

    // Up to `limit` latest earlier occurrences of the last n tokens (key: their key), latest first, as
    // Occurrences of the context (readable up to its end); returns how many.
    int occurrences(int n, uint64_t key, int limit, Occurrence* out) const {
        const size_t length = tokens_.size();
        const int32_t* suffix = tokens_.data() + length - n;
        int found = 0;
        for (uint32_t end = latest_.get(key); end != 0 && found < limit; end = previous_[end * max_n_ + n - 1]) {
            // end < n only on a hash collision between n-gram lengths: then there is nothing to compare
            if (end < static_cast<uint32_t>(n) || std::memcmp(&tokens_[end - n], suffix, n * sizeof(int32_t)) != 0)
                continue;
            out[found++] = Occurrence{tokens_.data() + end, end, static_cast<uint32_t>(length - end)};
        }
        return found;
    }

    // Prompt lookup (ngram.py's propose): appends up to k drafts; low / high already clamped to [1, max_n].
    void propose(int k, int low, int high, std::vector<int32_t>* out) const {
        const size_t length = tokens_.size();
        if (k <= 0 || length < 2) return;
        const int top = static_cast<int>(std::min<size_t>(high, length - 1));
        uint64_t keys[65];
        suffix_keys(0, tokens_.data(), length, top, keys);
        for (int n = top; n >= low; --n) {
            Occurrence found;
            if (occurrences(n, keys[n], 1, &found) == 0) continue;
            for (int j = 0; j < k; ++j)  // continuing periodically past the end
                out->push_back(static_cast<uint32_t>(j) < found.after ? found.at[j] : (*out)[out->size() - found.after]);
            return;
        }
    }

private:
    int max_n_;
    std::vector<int32_t> tokens_;
    LatestEnds latest_;
    std::vector<uint32_t> previous_;  // [end * max_n + n - 1]: the end before, same key (0 = none)
};

}  // namespace specd
