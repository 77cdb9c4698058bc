// Python columns in and out of the native store: lists, protobuf repeated fields, any sequence, read
// whole into vectors (one pass, no per-item Python objects kept), and vectors back as lists.
#pragma once

#include <pybind11/pybind11.h>

#include <string>
#include <vector>

namespace specd {

namespace py = pybind11;

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

}  // namespace specd
