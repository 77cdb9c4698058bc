// The drafter's sequence store in C++: drafter_service/state.py (with ngram.py, evidence.py and
// memory.py), one call per batch. The pieces are in native/: tables.h (n-gram keys, the latest-end
// table), ngram_index.h (one sequence), output_memory.h (the memory of earlier outputs), evidence.h
// (the drafting rule), columns.h (Python columns in and out).
//
// Same rules as the Python reference (read state.py's docstring first): start == 0 replaces a sequence;
// a start other than the held length, or an unknown sequence, asks for a re-sync (and drops what was
// held); least recently used sequences are evicted while the tokens held exceed the budget, the one just
// used last; a released sequence's output goes to the memory (unless its scope is off), an evicted or
// closed one's does not.
// Why native: in CPython the per-sequence loop cost ~11 us of interpreter work per sequence per step;
// here a batch is one call with flat columns in and flat columns out (arrays, not per-sequence objects).
//
// Memory per held token at max_ngram = 4: 4 bytes of context, 16 of chains, about 90 of table slots
// (16-byte slots at a load factor <= 0.7, when the n-grams are distinct).

#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>
#include <vector>

#include "native/columns.h"
#include "native/evidence.h"
#include "native/ngram_index.h"
#include "native/output_memory.h"
#include "native/tables.h"

namespace py = pybind11;

namespace {

using specd::NgramIndex;
using specd::Occurrence;
using specd::OutputMemory;
using specd::Partition;
using specd::int_column;
using specd::str_column;
using specd::to_list;

enum Scope { kGlobal = 0, kPerKey = 1, kOff = 2 };  // config.MEMORY_SCOPES, in order

// DrafterConfig's fields that the store reads.
struct Settings {
    int min_ngram, max_ngram, max_draft_tokens;
    long long max_tokens_held, max_memory_tokens;
    int scope;
    double min_draft_probability;
    bool ngram_only;  // drafting == "ngram": plain prompt lookup
};

// ---- the store: sequences by (session, id), least recently used first, and the memory -------------

class SequenceStore {
public:
    SequenceStore(int min_ngram, int max_ngram, int max_draft_tokens, long long max_tokens_held,
                  long long max_memory_tokens, int scope, double min_draft_probability, bool ngram_only)
        : settings_{min_ngram, max_ngram, max_draft_tokens, max_tokens_held, max_memory_tokens, scope,
                    min_draft_probability, ngram_only},
          memory_(max_ngram, max_memory_tokens) {
        if (max_ngram < 1 || max_ngram > 64) throw py::value_error("max_ngram: must be in [1, 64]");
        if (max_draft_tokens < 0) throw py::value_error("max_draft_tokens: must be >= 0");
        // unbeatable_[k]: a context draft scoring above it leaves the memory no chance, since each memory
        // token's chance is at most the memory's largest prior (a skipped search, the same drafts as
        // state.py; the margin covers rounding).
        double chance = 1.0, bound = 0.0;
        unbeatable_.push_back(1e-9);
        for (int k = 1; k <= max_draft_tokens; ++k) {
            chance *= memory_prior_(specd::kMaxMatch);
            bound += chance;
            unbeatable_.push_back(bound + 1e-9);
        }
        if (max_tokens_held < 1) throw py::value_error("max_tokens_held: must be >= 1");
        if (scope < kGlobal || scope > kOff) throw py::value_error("memory_scope: unknown");
    }

    // One batch: apply every delta and propose, in order. Columns are one entry per sequence, except
    // new_token_ids (the deltas concatenated) and min_ngrams / max_ngrams / tenant_keys (may be empty).
    // Returns (draft_counts, draft_token_ids concatenated, positions of sequences to re-sync,
    // draft tokens copied from the memory, [n] = sequences that asked and got n tokens).
    py::tuple propose_batch(uint64_t session, py::handle sequence_ids, py::handle starts,
                            py::handle new_token_counts, py::handle new_token_ids, py::handle draft_limits,
                            py::handle min_ngrams, py::handle max_ngrams, py::handle tenant_keys) {
        const auto ids = str_column(sequence_ids, "sequence_ids");
        const auto start = int_column<int64_t>(starts, "starts", 0, INT64_MAX);
        // uint32 on the wire; so bounded, the sum in check_columns cannot wrap
        const auto counts = int_column<int64_t>(new_token_counts, "new_token_counts", 0, UINT32_MAX);
        const auto tokens = int_column<int32_t>(new_token_ids, "new_token_ids", INT32_MIN, INT32_MAX);
        const auto ks = int_column<int64_t>(draft_limits, "draft_limits", 0, INT64_MAX);
        const auto mins = int_column<int64_t>(min_ngrams, "min_ngrams", 0, INT64_MAX);
        const auto maxs = int_column<int64_t>(max_ngrams, "max_ngrams", 0, INT64_MAX);
        const auto keys = str_column(tenant_keys, "tenant_keys");
        check_columns(ids.size(), start.size(), counts, tokens.size(), ks.size(), mins.size(), maxs.size(),
                      keys.size());

        std::vector<int64_t> draft_counts(ids.size(), 0);
        std::vector<int64_t> length_counts(static_cast<size_t>(settings_.max_draft_tokens) + 1, 0);
        std::vector<int32_t> drafts;
        std::vector<int64_t> resync;
        int64_t from_memory = 0;
        size_t position = 0;
        for (size_t i = 0; i < ids.size(); ++i) {
            Held* held = apply(key(session, ids[i]), start[i], tokens.data() + position,
                               static_cast<size_t>(counts[i]), keys.empty() ? kNoKey : keys[i]);
            position += static_cast<size_t>(counts[i]);
            if (held == nullptr) {
                resync.push_back(static_cast<int64_t>(i));
                continue;
            }
            // 0 (or no column) = the default; then clamped to the indexed range, as state.py does
            const int k = static_cast<int>(std::min<int64_t>(ks[i], settings_.max_draft_tokens));
            const int64_t low = std::max<int64_t>(mins.empty() || mins[i] == 0 ? settings_.min_ngram : mins[i], 1);
            const int64_t high = std::min<int64_t>(maxs.empty() || maxs[i] == 0 ? settings_.max_ngram : maxs[i],
                                                   settings_.max_ngram);
            const size_t before = drafts.size();
            if (k > 0 && low <= high && draft(*held, k, static_cast<int>(low), static_cast<int>(high), &drafts))
                from_memory += static_cast<int64_t>(drafts.size() - before);
            draft_counts[i] = static_cast<int64_t>(drafts.size() - before);
            if (k > 0) ++length_counts[static_cast<size_t>(draft_counts[i])];
        }
        return py::make_tuple(to_list(draft_counts), to_list(drafts), to_list(resync), from_memory,
                              to_list(length_counts));
    }

    // Forget finished or aborted sequences; their outputs go to the memory.
    void release(uint64_t session, py::handle sequence_ids) {
        for (const auto& id : str_column(sequence_ids, "released_sequence_ids")) {
            auto it = sequences_.find(key(session, id));
            if (it == sequences_.end()) continue;
            remember(it->second);
            drop(it->first);
        }
    }

    // Forget every sequence of a session (its stream closed; they are not remembered).
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
    size_t memory_tokens() const { return memory_.total_tokens(); }

private:
    struct Held {
        NgramIndex index;
        std::list<std::string>::iterator recency;
        size_t first_sight;  // tokens of its start = 0 delta; the rest is output
        Partition partition;  // its part of the memory ("" unless the scope is per-key)
    };

    inline static const std::string kNoKey;

    static std::string key(uint64_t session, const std::string& sequence_id) {
        std::string joined(sizeof session, '\0');
        std::memcpy(&joined[0], &session, sizeof session);
        return joined + sequence_id;
    }

    void check_columns(size_t n, size_t starts, const std::vector<int64_t>& counts, size_t tokens,
                       size_t ks, size_t mins, size_t maxs, size_t keys) const {
        if (starts != n || counts.size() != n || ks != n)
            throw py::value_error("sequence columns: starts, new_token_counts and draft_limits need "
                                  "one entry per sequence_ids entry");
        if ((mins != 0 && mins != n) || (maxs != 0 && maxs != n) || (keys != 0 && keys != n))
            throw py::value_error("min_ngrams, max_ngrams, tenant_keys: need one entry per sequence, or none");
        unsigned long long sum = 0;
        for (int64_t count : counts) sum += static_cast<unsigned long long>(count);
        if (sum != tokens) throw py::value_error("new_token_ids: length is not the sum of new_token_counts");
    }

    // Appends the draft of the rule in force; true when it came from the memory.
    bool draft(const Held& held, int k, int low, int high, std::vector<int32_t>* drafts) {
        const auto& context = held.index.tokens();
        const size_t length = context.size();
        if (length == 0) return false;
        if (settings_.ngram_only) {
            held.index.propose(k, low, high, drafts);
            return false;
        }
        Occurrence found[specd::kCandidates];
        uint64_t keys[65];
        int count = 0;
        const int top = static_cast<int>(std::min<size_t>(high, length - 1));
        specd::suffix_keys(0, context.data(), length, std::max(top, 0), keys);
        for (int n = top; n >= low && count == 0; --n) count = held.index.occurrences(n, keys[n], specd::kCandidates, found);
        const size_t first = drafts->size();
        const double own = specd::draft(context.data(), length, found, count, k, context_prior_,
                                        settings_.min_draft_probability, true, drafts);
        if (settings_.scope == kOff || memory_.total_tokens() == 0 || own > unbeatable_[k]) return false;
        const int memory_top = static_cast<int>(std::min<size_t>(high, length));
        specd::suffix_keys(held.partition.seed, context.data(), length, memory_top, keys);
        count = 0;
        for (int n = memory_top; n >= std::max(low, specd::kMinMemoryMatch) && count == 0; --n)
            count = memory_.occurrences(held.partition, context.data(), length, n, keys[n], specd::kCandidates, found);
        scratch_.clear();
        const double remembered = specd::draft(context.data(), length, found, count, k, memory_prior_,
                                               settings_.min_draft_probability, false, &scratch_);
        if (!(remembered > own)) return false;  // the context wins ties
        drafts->resize(first);
        drafts->insert(drafts->end(), scratch_.begin(), scratch_.end());
        return true;
    }

    // state.py's SequenceStore.apply: the sequence brought up to date, or nullptr to ask for a re-sync.
    Held* apply(const std::string& sequence_key, int64_t start, const int32_t* tokens, size_t count,
                const std::string& tenant_key) {
        Held* held;
        if (start == 0) {
            drop(sequence_key);
            lru_.push_back(sequence_key);
            Partition partition(settings_.scope == kPerKey ? tenant_key : kNoKey);
            held = &sequences_.emplace(sequence_key, Held{NgramIndex(settings_.max_ngram), std::prev(lru_.end()),
                                                          count, std::move(partition)}).first->second;
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
        if (total_tokens_ <= settings_.max_tokens_held) return held;
        while (total_tokens_ > settings_.max_tokens_held) {  // the one just used is last in line
            drop(std::string(lru_.front()));
            ++num_evicted_;
        }
        auto it = sequences_.find(sequence_key);
        return it == sequences_.end() ? nullptr : &it->second;
    }

    // Its output, after the last max_ngram tokens of its first sight (memory.py).
    void remember(const Held& held) {
        const auto& tokens = held.index.tokens();
        if (settings_.scope == kOff || settings_.ngram_only || tokens.size() <= held.first_sight) return;
        const size_t from = held.first_sight - std::min<size_t>(held.first_sight, settings_.max_ngram);
        memory_.add(held.partition, tokens.data() + from, tokens.size() - from);
    }

    void drop(const std::string& sequence_key) {
        auto it = sequences_.find(sequence_key);
        if (it == sequences_.end()) return;
        total_tokens_ -= static_cast<long long>(it->second.index.size());
        lru_.erase(it->second.recency);
        sequences_.erase(it);
    }

    Settings settings_;
    specd::Prior context_prior_ = specd::make_prior(0.7);  // evidence._CONTEXT_PRIOR
    specd::Prior memory_prior_ = specd::make_prior(0.85);  // evidence._MEMORY_PRIOR
    OutputMemory memory_;
    std::vector<double> unbeatable_;  // [k], see the constructor
    std::vector<int32_t> scratch_;
    long long total_tokens_ = 0;
    long long num_evicted_ = 0;
    std::unordered_map<std::string, Held> sequences_;
    std::list<std::string> lru_;  // keys, least recently used first
};

}  // namespace

PYBIND11_MODULE(_native_store, module) {
    module.doc() = "The drafter's sequence store in C++ (see drafter_service/stores.py)";
    py::class_<SequenceStore>(module, "SequenceStore")
        .def(py::init<int, int, int, long long, long long, int, double, bool>(), py::arg("min_ngram"),
             py::arg("max_ngram"), py::arg("max_draft_tokens"), py::arg("max_tokens_held"),
             py::arg("max_memory_tokens"), py::arg("memory_scope"), py::arg("min_draft_probability"),
             py::arg("ngram_only"))
        .def("propose_batch", &SequenceStore::propose_batch)
        .def("release", &SequenceStore::release)
        .def("release_session", &SequenceStore::release_session)
        .def("held_tokens", &SequenceStore::held_tokens)
        .def("__len__", &SequenceStore::size)
        .def_property_readonly("total_tokens", &SequenceStore::total_tokens)
        .def_property_readonly("num_evicted", &SequenceStore::num_evicted)
        .def_property_readonly("memory_tokens", &SequenceStore::memory_tokens);
}
