// has_int8_dot, the torch operators, and the Python module (DecodeSteps).
bool has_int8_dot() {
#ifdef LLMCLI_Q8_DOT
    return true;
#else
    return false;
#endif
}

// As torch operators: called from C++ dispatch (a few microseconds) rather than through a Python
// custom op (~45 us a call, which over 121 matmuls a token cost more than the matmuls), and visible
// to torch.compile, which keeps them in its graph (their fake kernels are registered in Python).
TORCH_LIBRARY(llmcli_gguf, m) {
    m.def("mm(Tensor x, Tensor blocks, int type, int K) -> Tensor");
    m.def("dequantize(Tensor blocks, int type, int K) -> Tensor");
    m.def("attend_one(Tensor q, Tensor k, Tensor v, Tensor mask, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(llmcli_gguf, CPU, m) {
    m.impl("mm", &mm);
    m.impl("dequantize", &dequantize);
    m.impl("attend_one", &attend_one);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("has_int8_dot", &has_int8_dot);
    pybind11::class_<DecodeSteps>(m, "DecodeSteps")
        .def(pybind11::init<int64_t, int64_t, int64_t, int64_t, double, double, int64_t>())
        .def("add_layer", &DecodeSteps::add_layer)
        .def("set_head", &DecodeSteps::set_head)
        .def("run", &DecodeSteps::run, pybind11::call_guard<pybind11::gil_scoped_release>());
}
