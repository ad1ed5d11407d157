// Python binding of the native store (module ucm_store._native). Argument parsing happens
// with the GIL held; every blocking call (I/O, waits, thread joins) runs with it released.
#include <Python.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

#include "block_file.hpp"
#include "checksum.hpp"
#include "fault.hpp"
#include "store.hpp"

namespace nb = nanobind;
using namespace ucm;

namespace {

struct TaskResult {
    std::vector<bool> ok;
    std::vector<std::string> errors;
    bool all_ok() const {
        for (bool b : ok)
            if (!b) return false;
        return true;
    }
};

TaskResult to_result(const Outcomes& o) {
    TaskResult r;
    r.ok.assign(o.ok.begin(), o.ok.end());
    r.errors = o.errors;
    return r;
}

// Buffers obtained through the buffer protocol stay acquired until the task's result is
// fetched (or the store closes), so the memory the workers write cannot go away under them.
struct BufferHolds {
    std::vector<Py_buffer> views;
    BufferHolds() = default;
    BufferHolds(const BufferHolds&) = delete;
    BufferHolds& operator=(const BufferHolds&) = delete;
    ~BufferHolds() {
        for (auto& v : views) PyBuffer_Release(&v);
    }
};

std::vector<Key> parse_keys(nb::handle seq) {
    PyObject* fast = PySequence_Fast(seq.ptr(), "keys must be a sequence of 16-byte bytes");
    if (!fast) throw nb::python_error();
    std::vector<Key> keys;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    keys.reserve(size_t(n));
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* k = PySequence_Fast_GET_ITEM(fast, i);
        if (PyBytes_Check(k) && PyBytes_GET_SIZE(k) == Py_ssize_t(kKeySize)) {
            keys.push_back(Key::from(PyBytes_AS_STRING(k)));
            continue;
        }
        std::string what = PyBytes_Check(k) ? std::to_string(PyBytes_GET_SIZE(k)) + " bytes"
                                             : std::string("a ") + Py_TYPE(k)->tp_name;
        Py_DECREF(fast);
        throw std::invalid_argument("key " + std::to_string(i) + " is " + what + "; keys are " +
                                    std::to_string(kKeySize) + "-byte binary digests (bytes)");
    }
    Py_DECREF(fast);
    return keys;
}

// None, or one entry per key: None (a block of its own) or (first block's key, index).
PackRefs parse_packs(nb::handle seq, size_t nkeys) {
    PackRefs refs;
    if (seq.is_none()) return refs;
    PyObject* fast = PySequence_Fast(seq.ptr(), "packs must be None or a sequence");
    if (!fast) throw nb::python_error();
    std::unique_ptr<PyObject, void (*)(PyObject*)> guard(fast, [](PyObject* o) { Py_DECREF(o); });
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (size_t(n) != nkeys)
        throw std::invalid_argument(std::to_string(nkeys) + " keys but " + std::to_string(n) +
                                    " pack references");
    refs.resize(nkeys);
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* r = PySequence_Fast_GET_ITEM(fast, i);
        if (r == Py_None) continue;
        PyObject *head = nullptr, *index = nullptr;
        if (PyTuple_Check(r) && PyTuple_GET_SIZE(r) == 2) {
            head = PyTuple_GET_ITEM(r, 0);
            index = PyTuple_GET_ITEM(r, 1);
        }
        if (!head || !PyBytes_Check(head) || PyBytes_GET_SIZE(head) != Py_ssize_t(kKeySize) ||
            !PyLong_Check(index))
            throw std::invalid_argument("pack reference " + std::to_string(i) +
                                        " must be None or (16-byte first key, index)");
        long long j = PyLong_AsLongLong(index);
        if (j < 0 || j >= (long long)kMaxPackBlocks)
            throw std::invalid_argument("pack reference " + std::to_string(i) + ": index " +
                                        std::to_string(j) + " out of 0.." +
                                        std::to_string(kMaxPackBlocks - 1));
        refs[size_t(i)] = PackRef{Key::from(PyBytes_AS_STRING(head)), uint32_t(j), true};
    }
    return refs;
}

std::vector<std::vector<Span>> parse_blocks(nb::handle seq, size_t nkeys,
                                            const std::vector<uint64_t>& shard_sizes,
                                            bool writable, BufferHolds& holds) {
    PyObject* fast = PySequence_Fast(seq.ptr(), "blocks must be a sequence of shard lists");
    if (!fast) throw nb::python_error();
    std::unique_ptr<PyObject, void (*)(PyObject*)> guard(fast, [](PyObject* o) { Py_DECREF(o); });
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (size_t(n) != nkeys)
        throw std::invalid_argument(std::to_string(nkeys) + " keys but " + std::to_string(n) +
                                    " blocks");
    std::vector<std::vector<Span>> blocks(nkeys);
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* bf = PySequence_Fast(PySequence_Fast_GET_ITEM(fast, i),
                                       "a block must be a sequence of shards");
        if (!bf) throw nb::python_error();
        std::unique_ptr<PyObject, void (*)(PyObject*)> bguard(bf,
                                                              [](PyObject* o) { Py_DECREF(o); });
        Py_ssize_t ns = PySequence_Fast_GET_SIZE(bf);
        if (size_t(ns) != shard_sizes.size())
            throw std::invalid_argument("block " + std::to_string(i) + " has " +
                                        std::to_string(ns) + " shards; the store expects " +
                                        std::to_string(shard_sizes.size()));
        auto& spans = blocks[size_t(i)];
        spans.reserve(size_t(ns));
        for (Py_ssize_t j = 0; j < ns; ++j) {
            PyObject* s = PySequence_Fast_GET_ITEM(bf, j);
            uint64_t addr = 0, len = 0;
            if (PyTuple_Check(s) && PyTuple_GET_SIZE(s) == 2) {
                addr = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(s, 0));
                len = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(s, 1));
                if (PyErr_Occurred()) throw nb::python_error();
                if (addr == 0)
                    throw std::invalid_argument("block " + std::to_string(i) + " shard " +
                                                std::to_string(j) + " has a null address");
            } else {
                Py_buffer view;
                int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
                if (PyObject_GetBuffer(s, &view, flags) != 0) throw nb::python_error();
                holds.views.push_back(view);
                addr = reinterpret_cast<uint64_t>(view.buf);
                len = uint64_t(view.len);
            }
            if (len != shard_sizes[size_t(j)])
                throw std::invalid_argument("block " + std::to_string(i) + " shard " +
                                            std::to_string(j) + " has " + std::to_string(len) +
                                            " bytes; the store expects " +
                                            std::to_string(shard_sizes[size_t(j)]));
            spans.push_back({reinterpret_cast<uint8_t*>(addr), len});
        }
    }
    return blocks;
}

class PyStore {
public:
    PyStore(const StoreConfig& cfg) : shard_sizes_(cfg.shard_sizes) {
        nb::gil_scoped_release nogil;  // prefaulting a large cache takes a while
        store_ = std::make_unique<Store>(cfg);
    }
    ~PyStore() {
        nb::gil_scoped_release nogil;
        store_.reset();
    }

    uint64_t submit(nb::handle keys_obj, nb::handle blocks_obj, bool is_dump, nb::handle packs_obj) {
        Store& s = live();
        auto keys = parse_keys(keys_obj);
        auto packs = parse_packs(packs_obj, keys.size());
        auto holds = std::make_shared<BufferHolds>();
        auto blocks = parse_blocks(blocks_obj, keys.size(), shard_sizes_, !is_dump, *holds);
        uint64_t tid;
        {
            nb::gil_scoped_release nogil;
            tid = is_dump ? s.dump(keys, blocks, packs) : s.load(keys, blocks, packs);
        }
        if (!holds->views.empty()) holds_[tid] = std::move(holds);
        return tid;
    }

    std::optional<TaskResult> wait(uint64_t tid, long long timeout_ms) {
        Store& s = live();
        std::optional<Outcomes> o;
        {
            nb::gil_scoped_release nogil;
            o = s.wait(tid, timeout_ms);
        }
        if (!o) return std::nullopt;
        holds_.erase(tid);  // the workers are done with the caller's buffers
        return to_result(*o);
    }

    std::optional<TaskResult> wait_persisted(uint64_t tid, long long timeout_ms) {
        Store& s = live();
        std::optional<Outcomes> o;
        {
            nb::gil_scoped_release nogil;
            o = s.wait_persisted(tid, timeout_ms);
        }
        if (!o) return std::nullopt;
        // Persisted implies the workers are done with the caller's buffers, and the store
        // has forgotten the task: a caller that only asks this must not leak the holds.
        holds_.erase(tid);
        return to_result(*o);
    }

    std::optional<TaskResult> cancel(uint64_t tid, const std::string& reason) {
        Store& s = live();
        std::optional<Outcomes> o;
        {
            nb::gil_scoped_release nogil;
            o = s.cancel(tid, reason);
        }
        holds_.erase(tid);  // no worker touches the caller's buffers any more
        return to_result(*o);
    }

    std::vector<bool> lookup(nb::handle keys_obj, int tier, nb::handle packs_obj) {
        Store& s = live();
        auto keys = parse_keys(keys_obj);
        auto packs = parse_packs(packs_obj, keys.size());
        nb::gil_scoped_release nogil;
        return s.lookup(keys, tier, packs);
    }

    size_t lookup_prefix(nb::handle keys_obj, nb::handle packs_obj) {
        Store& s = live();
        auto keys = parse_keys(keys_obj);
        auto packs = parse_packs(packs_obj, keys.size());
        nb::gil_scoped_release nogil;
        return s.lookup_prefix(keys, packs);
    }

    std::pair<std::string, uint32_t> pack_write(nb::handle keys_obj, nb::handle blocks_obj) {
        Store& s = live();
        auto keys = parse_keys(keys_obj);
        BufferHolds holds;
        auto blocks = parse_blocks(blocks_obj, keys.size(), shard_sizes_, false, holds);
        nb::gil_scoped_release nogil;
        return s.write_pack(keys, blocks);
    }

    uint32_t pack_prefix(nb::handle keys_obj) {
        Store& s = live();
        auto keys = parse_keys(keys_obj);
        nb::gil_scoped_release nogil;
        return s.pack_prefix(keys);
    }

    std::vector<std::string> pack_read(nb::handle keys_obj, uint32_t begin, uint32_t end,
                                       nb::handle blocks_obj) {
        Store& s = live();
        auto keys = parse_keys(keys_obj);
        if (begin > end || end > keys.size())
            throw std::invalid_argument("blocks [begin, end) must lie within the keys");
        BufferHolds holds;
        auto blocks = parse_blocks(blocks_obj, end - begin, shard_sizes_, true, holds);
        nb::gil_scoped_release nogil;
        return s.read_pack(keys, begin, end, blocks);
    }

    bool flush(long long timeout_ms) {
        Store& s = live();
        nb::gil_scoped_release nogil;
        return s.flush(timeout_ms);
    }

    nb::dict collect_garbage() {
        Store& s = live();
        GcReport r;
        {
            nb::gil_scoped_release nogil;
            r = s.collect_garbage();
        }
        nb::dict d;
        d["removed_blocks"] = r.removed_blocks;
        d["removed_bytes"] = r.removed_bytes;
        d["temps_reclaimed"] = r.temps_reclaimed;
        d["used_bytes"] = r.used_bytes;
        d["blocks"] = r.blocks;
        return d;
    }

    nb::dict stats() {
        nb::dict d;
        for (auto& [k, v] : live().stats()) d[k.c_str()] = v;
        return d;
    }

    void close() {
        if (!store_) return;
        {
            nb::gil_scoped_release nogil;
            store_->close();
        }
        holds_.clear();
    }

    Store& live() {
        if (!store_ || store_->closed()) throw std::runtime_error("the store is closed");
        return *store_;
    }
    bool closed() const { return !store_ || store_->closed(); }
    const std::vector<uint64_t>& shard_sizes() const { return shard_sizes_; }

private:
    std::vector<uint64_t> shard_sizes_;
    std::unique_ptr<Store> store_;
    std::unordered_map<uint64_t, std::shared_ptr<BufferHolds>> holds_;
};

}  // namespace

NB_MODULE(_native, m) {
    m.doc() = "ucm_store native block store (use the ucm_store package, not this module)";
    m.attr("FORMAT_VERSION") = kFormatVersion;
    m.attr("KEY_SIZE") = kKeySize;
    m.attr("CRC32C_HARDWARE") = crc32c_hardware();

    nb::class_<TaskResult>(m, "TaskResult", "Per-block outcome of a dump or load task.")
        .def_ro("ok", &TaskResult::ok, "list[bool]: one entry per block")
        .def_ro("errors", &TaskResult::errors, "list[str]: the reason per block, '' when ok")
        .def_prop_ro("all_ok", &TaskResult::all_ok)
        .def("__len__", [](const TaskResult& r) { return r.ok.size(); })
        .def("__repr__", [](const TaskResult& r) {
            size_t good = 0;
            for (bool b : r.ok) good += b;
            std::string s = "TaskResult(" + std::to_string(good) + "/" +
                            std::to_string(r.ok.size()) + " ok";
            for (size_t i = 0; i < r.ok.size(); ++i)
                if (!r.ok[i]) {
                    s += ", first error at block " + std::to_string(i) + ": " + r.errors[i];
                    break;
                }
            return s + ")";
        });

    nb::class_<PyStore>(m, "Store")
        .def(
            "__init__",
            [](PyStore* self, bool cache, bool posix, uint64_t cache_bytes,
               std::vector<std::string> backends, uint64_t posix_capacity, bool io_direct,
               bool io_fsync, std::vector<uint64_t> shard_sizes, unsigned copy_threads,
               unsigned io_threads, unsigned lookup_threads, bool cache_prefault,
               bool cache_on_load, double stale_temp_s, bool io_prefault) {
                StoreConfig c;
                c.cache = cache;
                c.posix = posix;
                c.cache_bytes = cache_bytes;
                c.posix_opts.backends = std::move(backends);
                c.posix_opts.capacity = posix_capacity;
                c.posix_opts.direct = io_direct;
                c.posix_opts.fsync = io_fsync;
                c.posix_opts.stale_temp_s = stale_temp_s;
                c.shard_sizes = std::move(shard_sizes);
                c.copy_threads = copy_threads;
                c.io_threads = io_threads;
                c.lookup_threads = lookup_threads;
                c.cache_prefault = cache_prefault;
                c.cache_on_load = cache_on_load;
                c.io_prefault = io_prefault;
                new (self) PyStore(c);
            },
            nb::arg("cache"), nb::arg("posix"), nb::arg("cache_bytes"), nb::arg("backends"),
            nb::arg("posix_capacity"), nb::arg("io_direct"), nb::arg("io_fsync"),
            nb::arg("shard_sizes"), nb::arg("copy_threads"), nb::arg("io_threads"),
            nb::arg("lookup_threads"), nb::arg("cache_prefault"), nb::arg("cache_on_load"),
            nb::arg("stale_temp_s"), nb::arg("io_prefault") = true)
        .def(
            "dump",
            [](PyStore& s, nb::handle k, nb::handle b, nb::handle p) { return s.submit(k, b, true, p); },
            nb::arg("keys"), nb::arg("blocks"), nb::arg("packs").none() = nb::none())
        .def(
            "load",
            [](PyStore& s, nb::handle k, nb::handle b, nb::handle p) { return s.submit(k, b, false, p); },
            nb::arg("keys"), nb::arg("blocks"), nb::arg("packs").none() = nb::none())
        .def("wait", &PyStore::wait, nb::arg("tid"), nb::arg("timeout_ms"))
        .def("wait_persisted", &PyStore::wait_persisted, nb::arg("tid"), nb::arg("timeout_ms"))
        .def("cancel", &PyStore::cancel, nb::arg("tid"), nb::arg("reason"))
        .def("lookup", &PyStore::lookup, nb::arg("keys"), nb::arg("tier"),
             nb::arg("packs").none() = nb::none())
        .def("lookup_prefix", &PyStore::lookup_prefix, nb::arg("keys"),
             nb::arg("packs").none() = nb::none())
        .def("flush", &PyStore::flush, nb::arg("timeout_ms"))
        .def("pack_write", &PyStore::pack_write, nb::arg("keys"), nb::arg("blocks"))
        .def("pack_prefix", &PyStore::pack_prefix, nb::arg("keys"))
        .def("pack_read", &PyStore::pack_read, nb::arg("keys"), nb::arg("begin"), nb::arg("end"),
             nb::arg("blocks"))
        .def("collect_garbage", &PyStore::collect_garbage)
        .def("stats", &PyStore::stats)
        .def("notes", [](PyStore& s) { return s.live().notes(); })
        .def("direct_io", [](PyStore& s) { return s.live().direct_io(); })
        .def_prop_ro("shard_sizes", &PyStore::shard_sizes)
        .def_prop_ro("closed", &PyStore::closed)
        .def("close", &PyStore::close);

    // Benchmark reference: the same bytes through a plain memcpy, GIL released.
    m.def("memcpy", [](uint64_t dst, uint64_t src, uint64_t n) {
        nb::gil_scoped_release nogil;
        std::memcpy(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
    });
    // The same for many shards in one call, so the reference pays no per-shard Python cost.
    m.def("memcpy_batch", [](const std::vector<std::tuple<uint64_t, uint64_t, uint64_t>>& ops) {
        nb::gil_scoped_release nogil;
        for (const auto& [dst, src, n] : ops)
            std::memcpy(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
    });
    m.def("crc32c", [](nb::bytes data) { return crc32c(data.c_str(), data.size()); });
    // Tests only: the next `times` passes through `site` ("posix_write" or "posix_read") throw
    // inside a store worker, in every store of this process.
    m.def(
        "_inject_fault",
        [](const std::string& site, int times) {
            if (site == "posix_write") fault::arm(fault::Site::PosixWrite, times);
            else if (site == "posix_read") fault::arm(fault::Site::PosixRead, times);
            else throw std::invalid_argument("unknown fault site " + site);
        },
        nb::arg("site"), nb::arg("times"));
    // Tests only: the next `times` passes through `site` sleep `ms` first (a stalled mount).
    m.def(
        "_inject_stall",
        [](const std::string& site, int times, int ms) {
            if (site == "posix_write") fault::arm_stall(fault::Site::PosixWrite, times, ms);
            else if (site == "posix_read") fault::arm_stall(fault::Site::PosixRead, times, ms);
            else if (site == "posix_stat") fault::arm_stall(fault::Site::PosixStat, times, ms);
            else throw std::invalid_argument("unknown fault site " + site);
        },
        nb::arg("site"), nb::arg("times"), nb::arg("ms"));
}
