// The proxy's work on each read of an answer that may move to another instance (module
// ucmctl.proxy._sse, used by ucmctl.proxy.resume.Answer): a read made of whole SSE events as
// vLLM streams them with return_token_ids, each carrying its token ids as the last list of the
// event (`,"token_ids":[...]`). The ids are kept (as written: digits and commas) and taken out of
// what the client gets unless it asked for them, with a completion's `,"prompt_token_ids":null`
// right before them. Any read it does not know for sure (a part of an event, an event without
// ids, an error event, [DONE], the prompt's ids after the choices) it leaves untouched and says
// so (None): the Python code reads that one. The last reads are kept for the Python code too.
#include <Python.h>
#include <nanobind/nanobind.h>

#include <array>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace nb = nanobind;

namespace {

constexpr std::string_view kIdsAt = ",\"token_ids\":[";
constexpr std::string_view kNoPromptIds = ",\"prompt_token_ids\":null";
constexpr std::string_view kPromptIdsKey = "\"prompt_token_ids\":";
constexpr std::string_view kData = "data: {";
constexpr std::string_view kError = "data: {\"error\"";
constexpr std::string_view kErrorObject = "\"object\":\"error\"";
constexpr std::string_view kEnd = "\n\n";
constexpr size_t kRecent = 4;  // reads kept (resume.Answer reads its finish and usage off them)

struct Span {
    size_t begin, cut, ids, ids_end, end;  // the event; where the cut starts; its ids; its end
};

class Feed {
public:
    explicit Feed(bool keep_ids) : keep_ids_(keep_ids) {}

    // The read as the client gets it, or None where the Python code must read it.
    nb::object feed(nb::bytes chunk) {
        std::string_view read(chunk.c_str(), chunk.size());
        if (read.size() < 2 || read.substr(read.size() - 2) != kEnd) return nb::none();
        spans_.clear();
        size_t at = 0;
        while (at < read.size()) {
            size_t end = read.find(kEnd, at);  // found: the read ends with one
            Span s{};
            if (!event(read, at, end, s)) return nb::none();
            spans_.push_back(s);
            at = end + kEnd.size();
        }
        for (const Span& s : spans_) {
            if (s.ids_end > s.ids) {
                if (!ids_.empty()) ids_.push_back(',');
                ids_.append(read.substr(s.ids, s.ids_end - s.ids));
            }
        }
        push(chunk);
        if (keep_ids_) return chunk;
        out_.clear();
        for (const Span& s : spans_) {
            out_.append(read.substr(s.begin, s.cut - s.begin));
            out_.append(read.substr(s.ids_end + 1, s.end - s.ids_end - 1));
            out_.append(kEnd);
        }
        return nb::steal(PyBytes_FromStringAndSize(out_.data(), static_cast<Py_ssize_t>(out_.size())));
    }

    // The ids read since the last call, as written ("1,2,3"), and forgets them.
    nb::bytes take_ids() {
        nb::bytes out(ids_.data(), ids_.size());
        ids_.clear();
        return out;
    }

    void push(nb::bytes read) {
        recent_[next_ % kRecent] = read;
        ++next_;
    }

    // The last reads, oldest first.
    nb::list recent() const {
        nb::list out;
        size_t n = next_ < kRecent ? next_ : kRecent;
        for (size_t i = next_ - n; i < next_; ++i) out.append(recent_[i % kRecent]);
        return out;
    }

private:
    // Whether `needle` is in `hay` (a short one: a scan for its first character, no search set-up).
    static bool has(std::string_view hay, std::string_view needle) {
        if (hay.size() < needle.size()) return false;
        for (size_t i = 0; i + needle.size() <= hay.size(); ++i)
            if (hay[i] == needle[0] && std::memcmp(hay.data() + i, needle.data(), needle.size()) == 0) return true;
        return false;
    }

    // Where the last `needle` (which starts with a character rare in the haystack's end) begins.
    static size_t last(std::string_view hay, std::string_view needle) {
        if (hay.size() < needle.size()) return std::string_view::npos;
        for (size_t i = hay.size() - needle.size() + 1; i-- > 0;)
            if (hay[i] == needle[0] && std::memcmp(hay.data() + i, needle.data(), needle.size()) == 0) return i;
        return std::string_view::npos;
    }

    // One event read[at:end] (without its blank line): an answer's tokens with their ids last.
    static bool event(std::string_view read, size_t at, size_t end, Span& s) {
        std::string_view ev = read.substr(at, end - at);
        if (ev.substr(0, kData.size()) != kData || ev.substr(0, kError.size()) == kError) return false;
        if (has(ev.substr(0, 40), kErrorObject)) return false;
        size_t ids = last(ev, kIdsAt);
        if (ids == std::string_view::npos) return false;
        const void* found = std::memchr(ev.data() + ids, ']', ev.size() - ids);
        if (found == nullptr) return false;
        size_t close = static_cast<const char*>(found) - ev.data();
        if (has(ev.substr(close + 1), kPromptIdsKey)) return false;
        size_t cut = ids;
        if (ids >= kNoPromptIds.size() && ev.substr(ids - kNoPromptIds.size(), kNoPromptIds.size()) == kNoPromptIds)
            cut = ids - kNoPromptIds.size();
        s = Span{at, at + cut, at + ids + kIdsAt.size(), at + close, end};
        return true;
    }

    bool keep_ids_;
    std::string ids_;
    std::string out_;
    std::vector<Span> spans_;
    std::array<nb::object, kRecent> recent_;
    size_t next_ = 0;
};

}  // namespace

NB_MODULE(_sse, m) {
    m.doc() = "The proxy's per-read work on an answer's token ids (see ucmctl.proxy.resume).";
    m.attr("RECENT") = kRecent;  // the Python code keeps as many
    nb::class_<Feed>(m, "Feed")
        .def(nb::init<bool>(), nb::arg("keep_ids"))
        .def("feed", &Feed::feed, nb::arg("chunk"))
        .def("take_ids", &Feed::take_ids)
        .def("push", &Feed::push, nb::arg("read"))
        .def("recent", &Feed::recent);
}
