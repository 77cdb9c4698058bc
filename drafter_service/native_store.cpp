// The drafter's sequence store in C++: drafter_service/state.py + ngram.py, with one call per batch.
//
// Same rules as the Python reference (read ngram.py's and state.py's docstrings first):
// - proposal: for n from max_n down to min_n, the most recent earlier occurrence of the last n tokens
//   wins; the draft copies what followed it, continuing periodically past the end (overlapping copy);
// - every n-gram of length 1..max_ngram that is already followed by a token maps to the end position of
//   its latest occurrence, keyed by a 64-bit hash and confirmed against the tokens before use (a
//   collision can only hide a match, never produce a wrong draft);
// - start == 0 replaces a sequence; a start other than the held length, or an unknown sequence, asks
//   for a re-sync (and drops what was held); least recently used sequences are evicted while the
//   tokens held exceed the budget, the one just used last.
// Why native: in CPython the per-sequence loop cost ~11 us of interpreter work per sequence per step;
// here a batch is one call with flat columns in and flat columns out (arrays, not per-sequence objects).
//
// Memory: 4 bytes per token plus one 16-byte slot per table entry at a load factor <= 0.7, about
// 130 bytes per held token at max_ngram = 4 when all n-grams are distinct (Python: ~420).

#include <pybind11/pybind11.h>

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <list>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace {

// ---- hashing: one chain per end position, extended backwards one token per n ----------------------

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
class LatestEnds {
public:
    void put(uint64_t key, uint32_t end) {
        if ((used_ + 1) * 10 > capacity_ * 7) grow(capacity_ == 0 ? 16 : capacity_ * 2);
        Slot& slot = slots_[find(key)];
        if (slot.key == 0) { slot.key = key; ++used_; }
        slot.end = end;
    }

    bool get(uint64_t key, uint32_t* end) const {
        if (capacity_ == 0) return false;
        const Slot& slot = slots_[find(key)];
        if (slot.key == 0) return false;
        *end = slot.end;
        return true;
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

// ---- one sequence: its context and n-gram index (ngram.py's NgramIndex with min_n = 1) -------------

class NgramIndex {
public:
    explicit NgramIndex(int max_n) : max_n_(max_n) {}

    size_t size() const { return tokens_.size(); }
    const std::vector<int32_t>& tokens() const { return tokens_; }

    void extend(const int32_t* tokens, size_t count) {
        const size_t length = tokens_.size() + count;
        if (length > tokens_.capacity()) tokens_.reserve(std::max(length, 2 * tokens_.capacity()));
        latest_.reserve(length * static_cast<size_t>(max_n_));  // at most max_n new n-grams a token
        for (size_t i = 0; i < count; ++i) append(tokens[i]);
    }

    // The n-grams ending at the old last token now have a continuation: index them, then append.
    void append(int32_t token) {
        const size_t end = tokens_.size();
        const int deepest = static_cast<int>(std::min<size_t>(max_n_, end));
        uint64_t chain = 0;
        for (int n = 1; n <= deepest; ++n) {
            chain = mix(chain, tokens_[end - n]);
            latest_.put(finish(chain, n), static_cast<uint32_t>(end));
        }
        tokens_.push_back(token);
    }

    // Appends up to k drafts to `out` by the rule above; low / high are already clamped to [1, max_n].
    void propose(int k, int low, int high, std::vector<int32_t>* out) const {
        const size_t length = tokens_.size();
        if (k <= 0 || length < 2) return;
        const int top = static_cast<int>(std::min<size_t>(high, length - 1));
        uint64_t chains[65];
        uint64_t chain = 0;
        for (int n = 1; n <= top; ++n) chains[n] = chain = mix(chain, tokens_[length - n]);
        for (int n = top; n >= low; --n) {
            uint32_t end;
            if (!latest_.get(finish(chains[n], n), &end)) continue;
            // end < n only on a hash collision between n-gram lengths: then there is nothing to compare
            if (end < static_cast<uint32_t>(n)
                || std::memcmp(&tokens_[end - n], &tokens_[length - n], n * sizeof(int32_t)) != 0) continue;
            copy_from(end, k, out);
            return;
        }
    }

private:
    void copy_from(size_t start, int count, std::vector<int32_t>* out) const {
        const size_t first = out->size();
        const size_t period = tokens_.size() - start;
        for (int j = 0; j < count; ++j) {
            size_t from = start + j;
            out->push_back(from < tokens_.size() ? tokens_[from] : (*out)[first + j - period]);
        }
    }

    int max_n_;
    std::vector<int32_t> tokens_;
    LatestEnds latest_;
};

// ---- reading Python columns (lists, protobuf repeated fields, any sequence) ------------------------

template <typename T>
std::vector<T> int_column(py::handle column, const char* name, long long low, long long high) {
    py::object fast = py::reinterpret_steal<py::object>(PySequence_Fast(column.ptr(), name));
    if (!fast) throw py::error_already_set();
    const Py_ssize_t size = PySequence_Fast_GET_SIZE(fast.ptr());
    PyObject** items = PySequence_Fast_ITEMS(fast.ptr());
    std::vector<T> values(static_cast<size_t>(size));
    for (Py_ssize_t i = 0; i < size; ++i) {
        long long value = PyLong_AsLongLong(items[i]);
        if (value == -1 && PyErr_Occurred()) throw py::error_already_set();
        if (value < low || value > high) throw py::value_error(std::string(name) + ": value out of range");
        values[static_cast<size_t>(i)] = static_cast<T>(value);
    }
    return values;
}

std::vector<std::string> str_column(py::handle column, const char* name) {
    py::object fast = py::reinterpret_steal<py::object>(PySequence_Fast(column.ptr(), name));
    if (!fast) throw py::error_already_set();
    const Py_ssize_t size = PySequence_Fast_GET_SIZE(fast.ptr());
    PyObject** items = PySequence_Fast_ITEMS(fast.ptr());
    std::vector<std::string> values(static_cast<size_t>(size));
    for (Py_ssize_t i = 0; i < size; ++i) {
        Py_ssize_t length;
        const char* text = PyUnicode_AsUTF8AndSize(items[i], &length);
        if (!text) throw py::error_already_set();
        values[static_cast<size_t>(i)].assign(text, static_cast<size_t>(length));
    }
    return values;
}

template <typename T>
py::list to_list(const std::vector<T>& values) {
    py::list list(values.size());
    for (size_t i = 0; i < values.size(); ++i) {
        PyObject* item = PyLong_FromLongLong(values[i]);
        if (!item) throw py::error_already_set();
        PyList_SET_ITEM(list.ptr(), static_cast<Py_ssize_t>(i), item);
    }
    return list;
}

// ---- the store: sequences by (session, id), least recently used first ------------------------------

class SequenceStore {
public:
    SequenceStore(int max_ngram, long long max_tokens_held)
        : max_ngram_(max_ngram), max_tokens_held_(max_tokens_held) {
        if (max_ngram < 1 || max_ngram > 64) throw py::value_error("max_ngram: must be in [1, 64]");
        if (max_tokens_held < 1) throw py::value_error("max_tokens_held: must be >= 1");
    }

    // One batch: apply every delta and propose, in order. Columns are one entry per sequence, except
    // new_token_ids (the deltas concatenated) and min_ngrams / max_ngrams (may be empty: defaults).
    // Returns (draft_counts, draft_token_ids concatenated, positions of sequences to re-sync).
    py::tuple propose_batch(uint64_t session, py::handle sequence_ids, py::handle starts,
                            py::handle new_token_counts, py::handle new_token_ids,
                            py::handle num_draft_tokens, py::handle min_ngrams, py::handle max_ngrams,
                            int default_min_ngram, int default_max_ngram, int max_draft_tokens) {
        const auto ids = str_column(sequence_ids, "sequence_ids");
        const auto start = int_column<int64_t>(starts, "starts", 0, INT64_MAX);
        // uint32 on the wire; so bounded, the sum in check_columns cannot wrap
        const auto counts = int_column<int64_t>(new_token_counts, "new_token_counts", 0, UINT32_MAX);
        const auto tokens = int_column<int32_t>(new_token_ids, "new_token_ids", INT32_MIN, INT32_MAX);
        const auto ks = int_column<int64_t>(num_draft_tokens, "num_draft_tokens", 0, INT64_MAX);
        const auto mins = int_column<int64_t>(min_ngrams, "min_ngrams", 0, INT64_MAX);
        const auto maxs = int_column<int64_t>(max_ngrams, "max_ngrams", 0, INT64_MAX);
        check_columns(ids.size(), start.size(), counts, tokens.size(), ks.size(), mins.size(), maxs.size());

        std::vector<int64_t> draft_counts(ids.size(), 0);
        std::vector<int32_t> drafts;
        std::vector<int64_t> resync;
        size_t position = 0;
        for (size_t i = 0; i < ids.size(); ++i) {
            NgramIndex* index = apply(key(session, ids[i]), start[i], tokens.data() + position,
                                      static_cast<size_t>(counts[i]));
            position += static_cast<size_t>(counts[i]);
            if (index == nullptr) {
                resync.push_back(static_cast<int64_t>(i));
                continue;
            }
            // 0 (or no column) = the default; then clamped to the indexed range, as ngram.py does
            const int64_t asked_min = mins.empty() || mins[i] == 0 ? default_min_ngram : mins[i];
            const int64_t asked_max = maxs.empty() || maxs[i] == 0 ? default_max_ngram : maxs[i];
            const int64_t low = std::max<int64_t>(asked_min, 1);
            const int64_t high = std::min<int64_t>(asked_max, max_ngram_);
            const size_t before = drafts.size();
            if (low <= high) {
                index->propose(static_cast<int>(std::min<int64_t>(ks[i], max_draft_tokens)),
                               static_cast<int>(low), static_cast<int>(high), &drafts);
            }
            draft_counts[i] = static_cast<int64_t>(drafts.size() - before);
        }
        return py::make_tuple(to_list(draft_counts), to_list(drafts), to_list(resync));
    }

    void release(uint64_t session, py::handle sequence_ids) {
        for (const auto& id : str_column(sequence_ids, "released_sequence_ids")) drop(key(session, id));
    }

    // Forget every sequence of a session (its stream closed).
    void release_session(uint64_t session) {
        const std::string prefix = key(session, "");
        for (auto it = lru_.begin(); it != lru_.end();) {
            const std::string held = *it++;  // a copy: drop() erases the list node it would refer to
            if (held.compare(0, prefix.size(), prefix) == 0) drop(held);
        }
    }

    // The context held for a sequence, or None (for tests).
    py::object held_tokens(uint64_t session, const std::string& sequence_id) const {
        auto it = sequences_.find(key(session, sequence_id));
        if (it == sequences_.end()) return py::none();
        return to_list(it->second.index.tokens());
    }

    size_t size() const { return sequences_.size(); }
    long long total_tokens() const { return total_tokens_; }
    long long num_evicted() const { return num_evicted_; }

private:
    struct Held {
        NgramIndex index;
        std::list<std::string>::iterator recency;
    };

    static std::string key(uint64_t session, const std::string& sequence_id) {
        std::string joined(sizeof session, '\0');
        std::memcpy(&joined[0], &session, sizeof session);
        return joined + sequence_id;
    }

    void check_columns(size_t n, size_t starts, const std::vector<int64_t>& counts, size_t tokens,
                       size_t ks, size_t mins, size_t maxs) const {
        if (starts != n || counts.size() != n || ks != n)
            throw py::value_error("sequence columns: starts, new_token_counts and num_draft_tokens need "
                                  "one entry per sequence_ids entry");
        if ((mins != 0 && mins != n) || (maxs != 0 && maxs != n))
            throw py::value_error("min_ngrams, max_ngrams: need one entry per sequence, or none");
        unsigned long long sum = 0;
        for (int64_t count : counts) sum += static_cast<unsigned long long>(count);
        if (sum != tokens) throw py::value_error("new_token_ids: length is not the sum of new_token_counts");
    }

    // state.py's SequenceStore.apply: the index brought up to date, or nullptr to ask for a re-sync.
    NgramIndex* apply(const std::string& sequence_key, int64_t start, const int32_t* tokens, size_t count) {
        Held* held;
        if (start == 0) {
            drop(sequence_key);
            lru_.push_back(sequence_key);
            held = &sequences_.emplace(sequence_key, Held{NgramIndex(max_ngram_), std::prev(lru_.end())})
                        .first->second;
        } else {
            auto it = sequences_.find(sequence_key);
            if (it == sequences_.end()) return nullptr;
            held = &it->second;
            if (static_cast<int64_t>(held->index.size()) != start) {
                drop(sequence_key);  // out of step: what we hold is of no use until the resend
                return nullptr;
            }
            lru_.splice(lru_.end(), lru_, held->recency);
        }
        held->index.extend(tokens, count);
        total_tokens_ += static_cast<long long>(count);
        if (total_tokens_ <= max_tokens_held_) return &held->index;
        while (total_tokens_ > max_tokens_held_) {  // the one just used is last in line
            drop(std::string(lru_.front()));
            ++num_evicted_;
        }
        auto it = sequences_.find(sequence_key);
        return it == sequences_.end() ? nullptr : &it->second.index;
    }

    void drop(const std::string& sequence_key) {
        auto it = sequences_.find(sequence_key);
        if (it == sequences_.end()) return;
        total_tokens_ -= static_cast<long long>(it->second.index.size());
        lru_.erase(it->second.recency);
        sequences_.erase(it);
    }

    int max_ngram_;
    long long max_tokens_held_;
    long long total_tokens_ = 0;
    long long num_evicted_ = 0;
    std::unordered_map<std::string, Held> sequences_;
    std::list<std::string> lru_;  // keys, least recently used first
};

}  // namespace

PYBIND11_MODULE(_native_store, module) {
    module.doc() = "The drafter's sequence store in C++ (see drafter_service/stores.py)";
    py::class_<SequenceStore>(module, "SequenceStore")
        .def(py::init<int, long long>(), py::arg("max_ngram"), py::arg("max_tokens_held"))
        .def("propose_batch", &SequenceStore::propose_batch)
        .def("release", &SequenceStore::release)
        .def("release_session", &SequenceStore::release_session)
        .def("held_tokens", &SequenceStore::held_tokens)
        .def("__len__", &SequenceStore::size)
        .def_property_readonly("total_tokens", &SequenceStore::total_tokens)
        .def_property_readonly("num_evicted", &SequenceStore::num_evicted);
}
