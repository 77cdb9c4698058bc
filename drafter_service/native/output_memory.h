// The memory of earlier outputs (drafter_service/memory.py, read its docstring first): remembered
// outputs in partitions, two generations of at most max_tokens / 2 tokens, each with an n-gram index
// (latest end per key, chains to the occurrence before) over the n-grams inside each output.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "evidence.h"
#include "tables.h"

namespace specd {

// A partition of the memory: its name (the tenant key, or "") and the seed of its index keys.
struct Partition {
    std::string name;
    uint64_t seed = 0;

    explicit Partition(std::string key = "") : name(std::move(key)) {
        uint64_t h = 0x5bd1e9955bd1e995ULL;
        for (unsigned char c : name) h = mix(h, c);
        seed = finish(h, 0);
    }
};

class OutputMemory {
public:
    OutputMemory(int max_n, long long max_tokens)
        : max_n_(max_n), generation_tokens_(static_cast<size_t>(std::max(max_tokens / 2, 1LL))) {}

    size_t total_tokens() const { return newer_.tokens.size() + older_.tokens.size(); }

    void add(const Partition& partition, const int32_t* tokens, size_t count) {
        if (count > generation_tokens_) {  // keep the last tokens of an output longer than a generation
            tokens += count - generation_tokens_;
            count = generation_tokens_;
        }
        if (newer_.tokens.size() + count > generation_tokens_) {
            std::swap(older_, newer_);
            newer_ = Generation();
        }
        newer_.add(partition, tokens, count, max_n_);
    }

    // Up to `limit` latest occurrences, in `partition`, of the context's last n tokens (key: their key
    // from the partition's seed), newer generation first; returns how many.
    int occurrences(const Partition& partition, const int32_t* context, size_t length, int n, uint64_t key,
                    int limit, Occurrence* out) const {
        int found = newer_.occurrences(partition, context + length - n, n, key, limit, max_n_, out);
        return found + older_.occurrences(partition, context + length - n, n, key, limit - found, max_n_, out + found);
    }

private:
    struct Segment {
        uint32_t start, end;
        const Partition* partition;  // owned by `partitions`
    };

    struct Generation {
        std::vector<int32_t> tokens;
        std::vector<uint32_t> segment_of;  // per position: index into segments
        std::vector<Segment> segments;
        std::vector<std::unique_ptr<Partition>> partitions;  // one per segment (a copy of its name)
        LatestEnds latest;
        std::vector<uint32_t> previous;  // [end * max_n + n - 1]: the end before, same key (0 = none)

        void add(const Partition& partition, const int32_t* added, size_t count, int max_n) {
            const uint32_t start = static_cast<uint32_t>(tokens.size());
            tokens.insert(tokens.end(), added, added + count);
            segment_of.insert(segment_of.end(), count, static_cast<uint32_t>(segments.size()));
            partitions.push_back(std::make_unique<Partition>(partition));
            segments.push_back(Segment{start, start + static_cast<uint32_t>(count), partitions.back().get()});
            previous.resize(tokens.size() * max_n, 0);
            latest.reserve(tokens.size() * static_cast<size_t>(max_n));
            for (uint32_t end = start + 1; end < start + count; ++end) {  // n-grams followed by a token of it
                const int deepest = static_cast<int>(std::min<uint32_t>(max_n, end - start));
                uint64_t chain = partition.seed;
                for (int n = 1; n <= deepest; ++n) {
                    chain = mix(chain, tokens[end - n]);
                    previous[end * max_n + n - 1] = latest.exchange(finish(chain, n), end);
                }
            }
        }

        int occurrences(const Partition& partition, const int32_t* suffix, int n, uint64_t key, int limit,
                        int max_n, Occurrence* out) const {
            int found = 0;
            if (limit <= 0 || tokens.empty()) return 0;
            for (uint32_t end = latest.get(key); end != 0 && found < limit; end = previous[end * max_n + n - 1]) {
                if (end < static_cast<uint32_t>(n)) continue;  // a collision between n-gram lengths
                const Segment& segment = segments[segment_of[end - 1]];
                // The partition is compared, not trusted to the key: a draft never crosses tenants.
                if (end - n < segment.start || end >= segment.end || segment.partition->seed != partition.seed
                    || segment.partition->name != partition.name
                    || std::memcmp(&tokens[end - n], suffix, n * sizeof(int32_t)) != 0)
                    continue;
                out[found++] = Occurrence{tokens.data() + end, end - segment.start, segment.end - end};
            }
            return found;
        }
    };

    int max_n_;
    size_t generation_tokens_;
    Generation newer_, older_;
};

}  // namespace specd
