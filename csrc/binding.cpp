#include <nanobind/nanobind.h>

namespace nb = nanobind;

NB_MODULE(_native, m) {
    m.doc() = "ucm_store native block store";
    m.attr("FORMAT_VERSION") = 1;
}
