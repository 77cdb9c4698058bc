// Hashing of n-grams and the open-addressing table from an n-gram's key to its latest end position.
//
// A key is built backwards from an end position, one token per n (so one pass gives the keys of every
// n <= max_n), from a seed (0 for a sequence's own context; the partition's hash in the memory, so
// tenants never share a key). 0 marks an empty slot; a key that comes out 0 is replaced by 1.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

namespace specd {

inline uint64_t mix(uint64_t h, int32_t token) {
    h ^= static_cast<uint32_t>(token) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    return h * 0xff51afd7ed558ccdULL;
}

inline uint64_t finish(uint64_t h, int n) {  // splitmix64's finaliser; 0 marks an empty slot
    h ^= static_cast<uint64_t>(n) * 0xc4ceb9fe1a85ec53ULL;
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ULL;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebULL;
    h ^= h >> 31;
    return h ? h : 1;
}

// Zeroed memory for a table; tables of 2 MiB and more ask for transparent huge pages, since at 256
// sequences of 32k tokens (1 GB of tables) TLB misses, not hashing, set the cost of a lookup.
struct Pages {
    void operator()(void* memory) const { std::free(memory); }
};

template <typename T>
std::unique_ptr<T[], Pages> zeroed(size_t count) {
    constexpr size_t huge = size_t{1} << 21;
    const size_t bytes = count * sizeof(T);
    void* memory = bytes >= huge ? std::aligned_alloc(huge, (bytes + huge - 1) / huge * huge)
                                 : std::malloc(bytes);
    if (memory == nullptr) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
    if (bytes >= huge) madvise(memory, bytes, MADV_HUGEPAGE);
#endif
    std::memset(memory, 0, bytes);
    return std::unique_ptr<T[], Pages>(static_cast<T*>(memory));
}

// Open addressing, linear probing, insert-or-overwrite only (entries are never deleted). Key and end
// share a slot so that a probe touches one cache line: at 256 sequences the tables do not fit in cache.
// End positions are >= 1 (an n-gram ends after its first token), so 0 means "none".
class LatestEnds {
public:
    // Sets key's end; returns the end it had (0 = none): the previous occurrence, for the chains.
    uint32_t exchange(uint64_t key, uint32_t end) {
        if ((used_ + 1) * 10 > capacity_ * 7) grow(capacity_ == 0 ? 16 : capacity_ * 2);
        Slot& slot = slots_[find(key)];
        if (slot.key == 0) { slot.key = key; ++used_; }
        const uint32_t before = slot.end;
        slot.end = end;
        return before;
    }

    uint32_t get(uint64_t key) const {
        if (capacity_ == 0) return 0;
        return slots_[find(key)].end;  // an empty slot's end is 0
    }

    void reserve(size_t entries) {
        size_t capacity = capacity_ == 0 ? 16 : capacity_;
        while (entries * 10 > capacity * 7) capacity *= 2;
        if (capacity != capacity_) grow(capacity);
    }

private:
    struct Slot {
        uint64_t key;  // 0 = empty
        uint32_t end;
    };

    size_t find(uint64_t key) const {
        const size_t mask = capacity_ - 1;
        size_t index = static_cast<size_t>(key) & mask;
        while (slots_[index].key != 0 && slots_[index].key != key) index = (index + 1) & mask;
        return index;
    }

    void grow(size_t capacity) {
        auto old = std::move(slots_);
        const size_t old_capacity = capacity_;
        slots_ = zeroed<Slot>(capacity);
        capacity_ = capacity;
        for (size_t i = 0; i < old_capacity; ++i) {
            if (old[i].key != 0) slots_[find(old[i].key)] = old[i];
        }
    }

    std::unique_ptr<Slot[], Pages> slots_;
    size_t capacity_ = 0;  // a power of two, or 0
    size_t used_ = 0;
};

// The keys of a context's last n tokens for n = 1..count (keys[n]), from `seed`.
inline void suffix_keys(uint64_t seed, const int32_t* tokens, size_t length, int count, uint64_t* keys) {
    uint64_t chain = seed;
    for (int n = 1; n <= count; ++n) {
        chain = mix(chain, tokens[length - n]);
        keys[n] = finish(chain, n);
    }
}

}  // namespace specd
