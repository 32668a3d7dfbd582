"""What a CUDA graph captured from a Python call holds: its nodes by type (kernel, memset,
memcpy, ...) and the names of its kernels, read through the driver API (libcuda) from
torch.cuda.CUDAGraph(keep_graph=True).raw_cuda_graph()."""
import collections
import ctypes

import torch

_TYPES = {0: "kernel", 1: "memcpy", 2: "memset", 3: "host", 4: "graph", 5: "empty", 6: "wait_event",
          7: "event_record", 8: "semaphore_signal", 9: "semaphore_wait", 10: "mem_alloc", 11: "mem_free",
          12: "batch_mem_op", 13: "conditional"}

_libcuda = None


def _driver():
    global _libcuda
    if _libcuda is None:
        _libcuda = ctypes.CDLL("libcuda.so.1")
    return _libcuda


def _kernel_name(lib, node):
    """The kernel's mangled name, or None where this driver cannot tell."""
    params = (ctypes.c_byte * 256)()  # CUDA_KERNEL_NODE_PARAMS(_v2) fits with room to spare
    get = getattr(lib, "cuGraphKernelNodeGetParams_v2", None) or lib.cuGraphKernelNodeGetParams
    if get(ctypes.c_void_p(node), params) != 0:
        return None
    ptrs = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
    func = ptrs[0]  # CUfunction, offset 0
    name = ctypes.c_char_p()
    if func and hasattr(lib, "cuFuncGetName") and lib.cuFuncGetName(ctypes.byref(name), ctypes.c_void_p(func)) == 0:
        return name.value.decode()
    # v2: CUkernel at offset 8 + 7 * 4 (rounded to 8) + 2 pointers = 56 bytes
    kern = ptrs[7]
    if kern and hasattr(lib, "cuKernelGetName") and lib.cuKernelGetName(ctypes.byref(name), ctypes.c_void_p(kern)) == 0:
        return name.value.decode()
    return None


def describe(graph_handle):
    """(Counter of node types, sorted kernel names or None where a name was not available)."""
    lib = _driver()
    n = ctypes.c_size_t(0)
    if lib.cuGraphGetNodes(ctypes.c_void_p(graph_handle), None, ctypes.byref(n)) != 0:
        raise RuntimeError("cuGraphGetNodes failed")
    nodes = (ctypes.c_void_p * n.value)()
    if n.value and lib.cuGraphGetNodes(ctypes.c_void_p(graph_handle), nodes, ctypes.byref(n)) != 0:
        raise RuntimeError("cuGraphGetNodes failed")
    kinds = collections.Counter()
    names = []
    for node in nodes:
        t = ctypes.c_int(-1)
        if lib.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(t)) != 0:
            raise RuntimeError("cuGraphNodeGetType failed")
        kind = _TYPES.get(t.value, str(t.value))
        kinds[kind] += 1
        if kind == "kernel":
            names.append(_kernel_name(lib, node))
    return kinds, (sorted(names) if all(names) else None)


def _profile_replay(g):
    """Node types and kernel names of a graph from a profiled replay (PyTorch without
    CUDAGraph(keep_graph=True)): every kernel, memset and copy the replay ran."""
    from torch.autograd import DeviceType
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        g.replay()
        torch.cuda.synchronize()
    kinds = collections.Counter()
    names = []
    for e in prof.events():
        if e.device_type != DeviceType.CUDA:
            continue
        n = e.name
        kind = "memset" if "memset" in n.lower() else "memcpy" if "memcpy" in n.lower() else "kernel"
        kinds[kind] += 1
        if kind == "kernel":
            names.append(n)
    return kinds, None


def capture(fn):
    """Runs fn() once on a side stream (workspaces, lazy loading), then captures it; returns
    (graph, fn's result from the capture, node types, kernel names)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    try:
        g = torch.cuda.CUDAGraph(keep_graph=True)
    except TypeError:
        g = None
    if g is None:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            result = fn()
        kinds, names = _profile_replay(g)
        return g, result, kinds, names
    with torch.cuda.graph(g):
        result = fn()
    kinds, names = describe(g.raw_cuda_graph())
    g.instantiate()
    return g, result, kinds, names
