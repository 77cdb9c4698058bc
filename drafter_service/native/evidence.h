// The evidence rule of drafter_service/evidence.py (read its docstring first): which earlier occurrence
// a draft copies, the estimated chance of each prefix, where the draft stops, and its score.
// The same floating-point operations in the same order as the Python reference, so both draft alike.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace specd {

constexpr int kCandidates = 4;  // evidence.CANDIDATES
constexpr int kMaxMatch = 32;   // evidence.MAX_MATCH
constexpr double kFirstMiss = 0.65;  // evidence.FIRST_MISS
constexpr int kMinMemoryMatch = 2;  // evidence.MIN_MEMORY_MATCH

// An earlier occurrence of the context's suffix: `at` points at the token after it.
struct Occurrence {
    const int32_t* at;
    uint32_t before;  // tokens readable before `at` (within its sequence)
    uint32_t after;  // tokens readable from `at` (within its sequence)
};

// prior[m] for match lengths m in [0, kMaxMatch] (longer ones read prior[kMaxMatch]).
struct Prior {
    double chance[kMaxMatch + 1];
    double operator()(int match_length) const { return chance[std::min(match_length, kMaxMatch)]; }
};

// evidence._prior_table: [m] = 1 - kFirstMiss * decay^(m - 1), by repeated products as there.
inline Prior make_prior(double decay) {
    Prior prior{};
    double miss = kFirstMiss;
    for (int m = 1; m <= kMaxMatch; ++m) {
        prior.chance[m] = 1.0 - miss;
        miss *= decay;
    }
    prior.chance[0] = prior.chance[1];
    return prior;
}

inline int match_length(const int32_t* context, size_t length, const Occurrence& occurrence) {
    const size_t limit = std::min<size_t>({length, occurrence.before, static_cast<size_t>(kMaxMatch)});
    size_t matched = 0;
    while (matched < limit && context[length - 1 - matched] == occurrence.at[-1 - static_cast<long>(matched)])
        ++matched;
    return static_cast<int>(matched);
}

// Appends the draft of one source to `out` and returns its score (0 with no tokens). `occurrences` are
// latest first, each matching >= 1 token; `periodic`: past its end, the followed copy repeats itself.
inline double draft(const int32_t* context, size_t length, const Occurrence* occurrences, int count, int k,
                    const Prior& prior, double threshold, bool periodic, std::vector<int32_t>* out) {
    if (k <= 0 || count == 0) return 0.0;
    int lengths[kCandidates];
    int longest = 0;
    for (int i = 0; i < count; ++i) longest = std::max(longest, lengths[i] = match_length(context, length, occurrences[i]));
    const Occurrence* followed = nullptr;
    const Occurrence* others[kCandidates];
    int num_others = 0;
    for (int i = 0; i < count; ++i) {
        if (lengths[i] != longest) continue;
        if (followed == nullptr) followed = &occurrences[i];
        else others[num_others++] = &occurrences[i];
    }
    const size_t first = out->size();
    double chance = 1.0, score = 0.0;
    for (int j = 0; j < k; ++j) {
        int32_t token;
        if (static_cast<uint32_t>(j) < followed->after) token = followed->at[j];
        else if (periodic) token = (*out)[first + j - followed->after];
        else break;
        int kept = 0, agreeing = 0;
        for (int i = 0; i < num_others; ++i) {  // keep those with a token at j, agreeing ones first
            if (others[i]->after <= static_cast<uint32_t>(j)) continue;
            others[kept++] = others[i];
        }
        const int present = kept;
        for (int i = 0; i < present; ++i) {
            if (others[i]->at[j] == token) others[agreeing++] = others[i];
        }
        chance *= prior(longest + j) * (agreeing + 1) / (present + 1);
        if (chance < threshold) break;
        out->push_back(token);
        score += chance;
        num_others = agreeing;
    }
    return score;
}

}  // namespace specd
