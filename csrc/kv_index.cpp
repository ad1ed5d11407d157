// The proxy's routing index in C (module ucmctl.proxy._kv, used by ucmctl.proxy.kv_index): a
// prompt's block keys and the walk over them that a `kv` routing decision makes, which in Python
// cost a 32k-token prompt ~1 ms each. The same keys and the same answers as the Python code
// (kv_index.py, the reference, which runs where this module is not built):
//
//   a block's key = mix(p[i]),  p[i] = p[i-1] * S + sum_j unit(u[j]) * R**j,  p[-1] = the seed,
//
// u the block's units (token ids, or a text prompt's bytes or little-endian 8-byte words), R
// and M odd, S = R**units, all mod 2**64, unit(u) = y ^ y >> 31 with y = u * M, mix splitmix64's
// finaliser. The index maps a block's key to the instances (uid, epoch) whose own cache holds
// it and whether the store does, least recently used first out past its size.
#include <Python.h>
#include <nanobind/nanobind.h>
#include <nanobind/make_iterator.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <array>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <sys/mman.h>

namespace nb = nanobind;

namespace {

constexpr uint64_t kR = 0x9E3779B97F4A7C15ULL;

constexpr uint64_t kM = 0xBF58476D1CE4E5B9ULL;

// A unit (a token id, a text prompt's byte or word) mixed on its own: a bijection, one multiply.
inline uint64_t unit_mix(uint64_t u) {
    const uint64_t y = u * kM;
    return y ^ (y >> 31);
}

// splitmix64's finaliser: a block's key of its chain value.
inline uint64_t mix(uint64_t x) {
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

// A prompt's block keys, kept as 64-bit integers: a sequence of ints to Python, read by the
// index without a conversion (a 32k-token prompt's 2,048 keys made Python ints and back cost
// more than the walk over them).
struct Keys {
    std::vector<uint64_t> keys;

    size_t size() const { return keys.size(); }
    uint64_t at(Py_ssize_t i) const {
        const auto n = static_cast<Py_ssize_t>(keys.size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) throw nb::index_error("block key index out of range");
        return keys[static_cast<size_t>(i)];
    }
    Keys slice(const nb::slice& s) const {
        auto [start, stop, step, n] = s.compute(keys.size());
        Keys out;
        out.keys.reserve(n);
        for (size_t k = 0; k < n; ++k, start += step) out.keys.push_back(keys[start]);
        return out;
    }
    bool operator==(const Keys& o) const { return keys == o.keys; }
    bool equals(nb::tuple t) const {  // as a tuple of the same ints would
        if (t.size() != keys.size()) return false;
        for (size_t i = 0; i < keys.size(); ++i) {
            if (!PyLong_Check(t[i].ptr())) return false;
            const unsigned long long v = PyLong_AsUnsignedLongLong(t[i].ptr());
            if (PyErr_Occurred()) {
                PyErr_Clear();
                return false;
            }
            if (v != keys[i]) return false;
        }
        return true;
    }
    size_t hash() const {
        uint64_t h = keys.size();
        for (uint64_t k : keys) h = mix(h ^ k);
        return static_cast<size_t>(h);
    }
};

// The chain over whole blocks of `per_block` units; `unit(i)` the i-th unit.
template <typename Unit>
Keys chain(size_t units, size_t per_block, uint64_t seed, Unit unit) {
    Keys out;
    const size_t blocks = per_block ? units / per_block : 0;
    if (blocks == 0) return out;
    std::vector<uint64_t> powers(per_block);
    uint64_t r = 1;
    for (size_t j = 0; j < per_block; ++j, r *= kR) powers[j] = r;
    const uint64_t step = r;  // R**per_block
    out.keys.resize(blocks);
    uint64_t p = seed;
    for (size_t i = 0; i < blocks; ++i) {
        uint64_t b = 0;
        const size_t base = i * per_block;
        for (size_t j = 0; j < per_block; ++j) b += unit_mix(unit(base + j)) * powers[j];
        p = p * step + b;
        out.keys[i] = mix(p);
    }
    return out;
}

// A token id of an int (a PyLong): false where it is beyond 8 bytes. A compact one is read in
// place, as CPython keeps it.
inline bool id_of(PyObject* item, uint64_t& out) {
#if PY_VERSION_HEX >= 0x030C0000
    if (PyLong_CheckExact(item) && PyUnstable_Long_IsCompact(reinterpret_cast<PyLongObject*>(item))) {
        out = static_cast<uint64_t>(PyUnstable_Long_CompactValue(reinterpret_cast<PyLongObject*>(item)));
        return true;
    }
#else
    if (PyLong_CheckExact(item)) {
        const Py_ssize_t size = Py_SIZE(item);
        const auto digit = static_cast<int64_t>(reinterpret_cast<PyLongObject*>(item)->ob_digit[0]);
        if (size == 0 || size == 1 || size == -1) {
            out = static_cast<uint64_t>(size * digit);
            return true;
        }
    }
#endif
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(item, &overflow);
    out = static_cast<uint64_t>(v);
    return overflow == 0;
}

// The keys of the whole blocks of a list (or tuple) of token ids; None where an item is not an
// int (the Python code decides for those), () where one is beyond 8 bytes (no model has it).
nb::object ids_keys(nb::handle ids, size_t block_size, uint64_t seed) {
    nb::object seq = nb::steal(PySequence_Fast(ids.ptr(), "token ids"));
    if (!seq.is_valid()) {
        PyErr_Clear();
        return nb::none();
    }
    const auto n = static_cast<size_t>(PySequence_Fast_GET_SIZE(seq.ptr()));
    PyObject** items = PySequence_Fast_ITEMS(seq.ptr());
    bool ok = true, beyond = false;  // not ints: None; an int beyond 8 bytes: no keys
    auto read = [&](size_t i) {
        uint64_t v = 0;
        if (!PyLong_Check(items[i]))
            ok = false;
        else if (!id_of(items[i], v))
            beyond = true;
        return v;
    };
    for (size_t i = n / (block_size ? block_size : 1) * block_size; i < n; ++i) read(i);  // after the blocks
    Keys keys = chain(n, block_size, seed, read);
    if (!ok) return nb::none();
    return nb::cast(beyond ? Keys() : std::move(keys));
}

// Whether `obj` is a list of ints (not bools): a prompt of token ids as a request's JSON gives it.
// One type check an item (Python's `all(type(t) is int ...)` costs ~40 ns an item: 1.3 ms for 32k).
bool all_ints(nb::handle obj) {
    if (!PyList_CheckExact(obj.ptr())) return false;
    const Py_ssize_t n = PyList_GET_SIZE(obj.ptr());
    for (Py_ssize_t i = 0; i < n; ++i)
        if (!PyLong_CheckExact(PyList_GET_ITEM(obj.ptr(), i))) return false;
    return true;
}

// A JSON array of integers in `p[i..n)`, i at its '[', read as json's scanner reads it: its values
// into `out`, and the index past its ']'; -1 where it is anything else (a float, a string, a
// nested value, an int of 19 digits or more, JSON it is not), which json's scanner reads then.
template <typename C>
Py_ssize_t read_int_list(const C* p, Py_ssize_t n, Py_ssize_t i, std::vector<long long>& out) {
    auto space = [&] {
        while (i < n && (p[i] == ' ' || p[i] == '\t' || p[i] == '\n' || p[i] == '\r')) ++i;
    };
    auto digit = [&](Py_ssize_t k) { return k < n && p[k] >= '0' && p[k] <= '9'; };
    if (i >= n || p[i] != '[') return -1;
    ++i;
    space();
    if (i < n && p[i] == ']') return i + 1;
    for (;;) {
        space();
        const bool negative = i < n && p[i] == '-';
        if (negative) ++i;
        if (!digit(i) || (p[i] == '0' && digit(i + 1))) return -1;  // JSON: no leading zero
        unsigned long long v = 0;
        int digits = 0;
        for (; digit(i); ++i) {
            if (++digits > 18) return -1;  // beyond 8 bytes, perhaps: Python's ints read it
            v = v * 10 + static_cast<unsigned long long>(p[i] - '0');
        }
        if (i < n && (p[i] == '.' || p[i] == 'e' || p[i] == 'E')) return -1;  // a float
        out.push_back(negative ? -static_cast<long long>(v) : static_cast<long long>(v));
        space();
        if (i >= n) return -1;
        if (p[i] == ']') return i + 1;
        if (p[i] != ',') return -1;
        ++i;
    }
}

// `text[start:]` begins a JSON array of integers: (the list, the index past it, the same ints as
// 8-byte little-endian words: what `packed_keys` reads); else None. json's scanner makes each int
// from its digits' string (~60 ns an id: 2 ms for 32k); this reads them in place.
nb::object int_list(nb::str text, Py_ssize_t start) {
    PyObject* s = text.ptr();
    const Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    if (start < 0 || start >= n) return nb::none();
    std::vector<long long> values;
    Py_ssize_t end = -1;
    switch (PyUnicode_KIND(s)) {
        case PyUnicode_1BYTE_KIND: end = read_int_list(PyUnicode_1BYTE_DATA(s), n, start, values); break;
        case PyUnicode_2BYTE_KIND: end = read_int_list(PyUnicode_2BYTE_DATA(s), n, start, values); break;
        default: end = read_int_list(PyUnicode_4BYTE_DATA(s), n, start, values); break;
    }
    if (end < 0) return nb::none();
    nb::object list = nb::steal(PyList_New(static_cast<Py_ssize_t>(values.size())));
    if (!list.is_valid()) throw nb::python_error();
    for (size_t k = 0; k < values.size(); ++k) {
        PyObject* v = PyLong_FromLongLong(values[k]);
        if (v == nullptr) throw nb::python_error();
        PyList_SET_ITEM(list.ptr(), static_cast<Py_ssize_t>(k), v);
    }
    static_assert(sizeof(long long) == 8, "8-byte words");
    nb::bytes packed(values.data(), values.size() * sizeof(long long));
    return nb::make_tuple(list, end, packed);
}

// The keys of the whole blocks of token ids given as 8-byte words (`int_list`'s third value):
// `ids_keys` of the same ints, without reading an int object a token (~40 us for 32k of them).
Keys packed_keys(nb::bytes packed, size_t block_size, uint64_t seed) {
    if (packed.size() % 8 != 0) throw nb::value_error("token ids packed as 8-byte words expected");
    const char* raw = packed.c_str();
    return chain(packed.size() / 8, block_size, seed, [&](size_t i) {
        uint64_t v;
        std::memcpy(&v, raw + i * 8, 8);
        return v;
    });
}

// The keys of a text prompt's whole blocks of `per_block` bytes: 8-byte little-endian words
// where a block is whole words, else single bytes.
Keys bytes_keys(nb::bytes data, size_t per_block, uint64_t seed) {
    const auto* raw = reinterpret_cast<const unsigned char*>(data.c_str());
    if (per_block % 8 != 0)
        return chain(data.size(), per_block, seed, [&](size_t i) { return static_cast<uint64_t>(raw[i]); });
    const size_t words = data.size() / per_block * per_block / 8;
    return chain(words, per_block / 8, seed, [&](size_t i) {
        uint64_t w = 0;
        for (int k = 7; k >= 0; --k) w = (w << 8) | raw[i * 8 + static_cast<size_t>(k)];
        return w;
    });
}

using Holder = std::pair<int64_t, int64_t>;  // an instance's uid and epoch

// Memory for the index's table, of 2 MiB pages where it is that large and the kernel gives them
// (transparent huge pages, asked for before the pages are touched): a walk touches one slot a
// block, scattered over tens of MiB, and with 4 KiB pages each slot is a TLB miss of its own.
template <typename T>
struct HugePages {
    using value_type = T;
    static constexpr size_t kHuge = size_t{2} << 20;
    HugePages() = default;
    template <typename U>
    HugePages(const HugePages<U>&) {}
    T* allocate(size_t n) {
        const size_t bytes = n * sizeof(T);
        if (bytes < kHuge) {
            void* p = std::malloc(bytes);
            if (p == nullptr) throw std::bad_alloc();
            return static_cast<T*>(p);
        }
        const size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
        void* p = std::aligned_alloc(kHuge, rounded);
        if (p == nullptr) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
        madvise(p, rounded, MADV_HUGEPAGE);  // advice: without it, the same table of small pages
#endif
        return static_cast<T*>(p);
    }
    void deallocate(T* p, size_t) { std::free(p); }
    template <typename U>
    bool operator==(const HugePages<U>&) const { return true; }
};

// Keys as the Python code passes them: Keys (read in place), or a sequence of ints below 2**64
// (the events'), converted into `out`.
const std::vector<uint64_t>& keys_of(nb::handle keys, std::vector<uint64_t>& out) {
    if (nb::isinstance<Keys>(keys)) return nb::cast<const Keys&>(keys).keys;
    nb::object seq = nb::steal(PySequence_Fast(keys.ptr(), "block keys"));
    if (!seq.is_valid()) throw nb::python_error();
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.ptr());
    PyObject** items = PySequence_Fast_ITEMS(seq.ptr());
    out.resize(static_cast<size_t>(n));
    for (Py_ssize_t i = 0; i < n; ++i) {
        out[static_cast<size_t>(i)] = PyLong_AsUnsignedLongLong(items[i]);
        if (PyErr_Occurred()) throw nb::python_error();
    }
    return out;
}

// The index: an open-addressing table (linear probing) of one 64-byte slot a block (32 MiB at
// the proxy's bound of 262,144 blocks, the table half full), with its holders inline (a sixth
// and more in `spill_`, rare: a block held by many instances) and the order of use as a list
// linked through the slots. A walk over a prompt's keys touches one slot a block, fetched ahead;
// std::unordered_map's node, bucket and holder vector cost three misses.
class Index {
public:
    explicit Index(size_t entries) : entries_(entries) { rehash(16); }

    size_t size() const { return size_; }

    // The memory it holds: the table, and the holders spilled out of it.
    size_t nbytes() const {
        size_t n = slots_.capacity() * sizeof(Slot);
        for (const auto& [key, more] : spill_) n += 64 + more.capacity() * sizeof(more[0]);
        return n;
    }

    // How many leading blocks each holder has in its own cache, and how many the store has: one
    // walk, ended where none holds the next block.
    std::pair<std::vector<size_t>, size_t> leading(nb::handle keys, const std::vector<Holder>& mine) const {
        std::vector<uint64_t> converted;
        const std::vector<uint64_t>& ks = keys_of(keys, converted);
        std::vector<size_t> held(mine.size(), 0);
        std::vector<size_t> live(mine.size());
        for (size_t k = 0; k < live.size(); ++k) live[k] = k;
        size_t stored = 0;
        bool storing = true;
        for (size_t n = 1; n <= ks.size(); ++n) {
            if (n + kAhead <= ks.size()) __builtin_prefetch(&slots_[home(ks[n + kAhead - 1])]);
            const uint32_t at = find(ks[n - 1]);
            if (at == kNil) break;
            const Slot& e = slots_[at];
            if (storing && e.stored)
                stored = n;
            else
                storing = false;
            size_t kept = 0;
            for (size_t k : live)
                if (holds(e, mine[k])) live[kept++] = k;
            live.resize(kept);
            for (size_t k : live) held[k] = n;
            if (live.empty() && !storing) break;
        }
        return {std::move(held), stored};
    }

    // `me` computed or loaded these blocks (and, `saved`, the store has them now): each becomes
    // the most recently used, last to first (the bound takes a prompt's tail before its head);
    // an earlier epoch of the same instance is no longer a holder.
    void took(nb::handle keys, Holder me, bool saved) {
        std::vector<uint64_t> converted;
        const std::vector<uint64_t>& ks = keys_of(keys, converted);
        for (auto it = ks.rbegin(); it != ks.rend(); ++it) {
            const uint64_t key = *it;
            uint32_t at = find(key);
            if (at == kNil) {
                // at most 3/4 full (a prompt's blocks above the bound stay until the end of it)
                if ((size_ + 1) * 4 > slots_.size() * 3) rehash(slots_.size() * 2);
                at = insert(key);
            } else {
                unlink(at);
            }
            link_last(at);
            drop(slots_[at], me.first);
            add(slots_[at], me);
            slots_[at].stored = slots_[at].stored || saved;
        }
        while (size_ > entries_) erase(head_);
    }

    // Instance `uid` no longer holds these blocks in its own cache (in no epoch).
    void lost(nb::handle keys, int64_t uid) {
        std::vector<uint64_t> converted;
        for (uint64_t key : keys_of(keys, converted)) {
            const uint32_t at = find(key);
            if (at != kNil) drop(slots_[at], uid);
        }
    }

private:
    static constexpr uint32_t kNil = UINT32_MAX;
    static constexpr size_t kInline = 5;
    static constexpr size_t kAhead = 24;  // slots fetched ahead of the walk

    struct Slot {
        uint64_t key = 0;
        uint32_t prev = kNil, next = kNil;  // the order of use: least recently used first
        bool used = false, stored = false, spilled = false;
        uint8_t count = 0;  // holders inline
        std::array<std::pair<uint32_t, uint32_t>, kInline> inline_{};
    };

    uint32_t home(uint64_t key) const { return static_cast<uint32_t>((key * kR) >> shift_); }

    uint32_t find(uint64_t key) const {
        for (uint32_t i = home(key);; i = (i + 1) & mask_) {
            const Slot& s = slots_[i];
            if (!s.used) return kNil;
            if (s.key == key) return i;
        }
    }

    uint32_t insert(uint64_t key) {
        uint32_t i = home(key);
        while (slots_[i].used) i = (i + 1) & mask_;
        slots_[i] = Slot{};
        slots_[i].key = key;
        slots_[i].used = true;
        ++size_;
        return i;
    }

    // Removes slot `i` (and its holders), moving back the slots probed past it.
    void erase(uint32_t i) {
        unlink(i);
        if (slots_[i].spilled) spill_.erase(slots_[i].key);
        for (uint32_t j = (i + 1) & mask_; slots_[j].used; j = (j + 1) & mask_) {
            const uint32_t h = home(slots_[j].key);
            // j stays where its home lies cyclically in (i, j]
            if (i <= j ? (i < h && h <= j) : (i < h || h <= j)) continue;
            move(j, i);
            i = j;
        }
        slots_[i].used = false;
        --size_;
    }

    void move(uint32_t from, uint32_t to) {
        slots_[to] = slots_[from];
        Slot& s = slots_[to];
        (s.prev == kNil ? head_ : slots_[s.prev].next) = to;
        (s.next == kNil ? tail_ : slots_[s.next].prev) = to;
    }

    void unlink(uint32_t i) {
        Slot& s = slots_[i];
        (s.prev == kNil ? head_ : slots_[s.prev].next) = s.next;
        (s.next == kNil ? tail_ : slots_[s.next].prev) = s.prev;
        s.prev = s.next = kNil;
    }

    void link_last(uint32_t i) {
        slots_[i].prev = tail_;
        (tail_ == kNil ? head_ : slots_[tail_].next) = i;
        tail_ = i;
    }

    void rehash(size_t capacity) {
        std::vector<Slot, HugePages<Slot>> old = std::move(slots_);
        const uint32_t first = head_;
        slots_.assign(capacity, Slot{});
        mask_ = static_cast<uint32_t>(capacity - 1);
        shift_ = 64 - __builtin_ctzll(capacity);
        head_ = tail_ = kNil;
        size_ = 0;
        for (uint32_t o = first; o != kNil; o = old[o].next) {  // in the order of use
            const uint32_t at = insert(old[o].key);
            Slot& s = slots_[at];
            s.stored = old[o].stored;
            s.spilled = old[o].spilled;
            s.count = old[o].count;
            s.inline_ = old[o].inline_;
            link_last(at);
        }
    }

    static std::pair<uint32_t, uint32_t> compact(Holder h) {
        if (h.first < 0 || h.second < 0 || h.first > UINT32_MAX || h.second > UINT32_MAX)
            throw nb::value_error("an instance's uid and epoch are below 2**32");
        return {static_cast<uint32_t>(h.first), static_cast<uint32_t>(h.second)};
    }

    bool holds(const Slot& s, Holder h) const {
        if (h.first < 0 || h.second < 0 || h.first > UINT32_MAX || h.second > UINT32_MAX) return false;
        const std::pair<uint32_t, uint32_t> c{static_cast<uint32_t>(h.first), static_cast<uint32_t>(h.second)};
        for (size_t k = 0; k < s.count; ++k)
            if (s.inline_[k] == c) return true;
        if (!s.spilled) return false;
        for (const auto& x : spill_.at(s.key))
            if (x == c) return true;
        return false;
    }

    void add(Slot& s, Holder h) {
        const std::pair<uint32_t, uint32_t> c = compact(h);
        if (s.count < kInline) {
            s.inline_[s.count++] = c;
        } else {
            spill_[s.key].push_back(c);
            s.spilled = true;
        }
    }

    // Drops `uid`'s holder (in whatever epoch) from the block: at most one.
    void drop(Slot& s, int64_t uid) {
        for (size_t k = 0; k < s.count; ++k) {
            if (s.inline_[k].first != uid) continue;
            s.inline_[k] = s.inline_[--s.count];
            if (s.spilled) {  // one of the spilled takes the place freed
                auto& more = spill_.at(s.key);
                s.inline_[s.count++] = more.back();
                more.pop_back();
                if (more.empty()) {
                    spill_.erase(s.key);
                    s.spilled = false;
                }
            }
            return;
        }
        if (!s.spilled) return;
        auto& more = spill_.at(s.key);
        for (size_t k = 0; k < more.size(); ++k) {
            if (more[k].first != uid) continue;
            more[k] = more.back();
            more.pop_back();
            if (more.empty()) {
                spill_.erase(s.key);
                s.spilled = false;
            }
            return;
        }
    }

    size_t entries_;
    std::vector<Slot, HugePages<Slot>> slots_;
    std::unordered_map<uint64_t, std::vector<std::pair<uint32_t, uint32_t>>> spill_;
    uint32_t mask_ = 0, head_ = kNil, tail_ = kNil;
    int shift_ = 64;
    size_t size_ = 0;
};

}  // namespace

NB_MODULE(_kv, m) {
    m.doc() = "The proxy's routing index: block keys and the walk over them (see ucmctl.proxy.kv_index).";
    nb::class_<Keys>(m, "Keys")
        .def("__len__", &Keys::size)
        .def("__getitem__", &Keys::at, nb::arg("index"))
        .def("__getitem__", &Keys::slice, nb::arg("index"))
        .def(
            "__iter__",
            [](const Keys& k) {
                return nb::make_iterator(nb::type<Keys>(), "iterator", k.keys.begin(), k.keys.end());
            },
            nb::keep_alive<0, 1>())
        .def("__eq__", [](const Keys& a, const Keys& b) { return a == b; }, nb::is_operator())
        .def("__eq__", [](const Keys& a, nb::tuple b) { return a.equals(b); }, nb::is_operator())
        .def("__ne__", [](const Keys& a, const Keys& b) { return !(a == b); }, nb::is_operator())
        .def("__ne__", [](const Keys& a, nb::tuple b) { return !a.equals(b); }, nb::is_operator())
        .def("__hash__", &Keys::hash)
        .def("__repr__", [](const Keys& k) { return "Keys(" + std::to_string(k.size()) + " blocks)"; });
    m.def("ids_keys", &ids_keys, nb::arg("ids"), nb::arg("block_size"), nb::arg("seed"));
    m.def("all_ints", &all_ints, nb::arg("obj"));
    m.def("int_list", &int_list, nb::arg("text"), nb::arg("start"));
    m.def("packed_keys", &packed_keys, nb::arg("packed"), nb::arg("block_size"), nb::arg("seed"));
    m.def("bytes_keys", &bytes_keys, nb::arg("data"), nb::arg("per_block"), nb::arg("seed"));
    nb::class_<Index>(m, "Index")
        .def(nb::init<size_t>(), nb::arg("entries"))
        .def("__len__", &Index::size)
        .def_prop_ro("nbytes", &Index::nbytes)
        .def("leading", &Index::leading, nb::arg("keys"), nb::arg("holders"))
        .def("took", &Index::took, nb::arg("keys"), nb::arg("holder"), nb::arg("saved"))
        .def("lost", &Index::lost, nb::arg("keys"), nb::arg("uid"));
}
