"""The probe behind docs/performance.md's copy-issue numbers (probe.txt, H200 host): the host time to issue 24 mini-expert
copies from pinned memory three ways, torch._foreach_copy_, one ctypes cudaMemcpyAsync each, one cudaMemcpyBatchAsync,
interleaved over 15 rounds, with each way's wire rate and a check that the bytes land. On a CUDA host:

    python bench/results/h200-copy-issue/probe.py
"""
import ctypes, statistics, time, torch
lib = None
for line in open("/proc/self/maps"):
    if "libcudart.so" in line:
        lib = line.split()[-1]; break
print("libcudart:", lib)
rt = ctypes.CDLL(lib)
v = ctypes.c_int(); rt.cudaRuntimeGetVersion(ctypes.byref(v)); print("runtime version", v.value)
dev = "cuda"
nb = 3 * 2048 * 512 * 2  # a mini expert, bytes
E, n = 64, 24
host = torch.empty(E, nb, dtype=torch.uint8).pin_memory()
slots = torch.empty(n, nb, dtype=torch.uint8, device=dev)
stream = torch.cuda.Stream()
sh = ctypes.c_void_p(stream.cuda_stream)
rt.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
hp = [host[e].data_ptr() for e in range(E)]; dp = [slots[i].data_ptr() for i in range(n)]
hv = [host[e] for e in range(E)]; dv = [slots[i] for i in range(n)]

def torch_way(k):
    with torch.cuda.stream(stream):
        torch._foreach_copy_(dv, [hv[(k + i) % E] for i in range(n)], non_blocking=True)
def ctypes_way(k):
    f = rt.cudaMemcpyAsync
    for i in range(n):
        r = f(dp[i], hp[(k + i) % E], nb, 1, sh)
        if r: raise RuntimeError(r)
class Loc(ctypes.Structure): _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]
class Attr(ctypes.Structure): _fields_ = [("srcAccessOrder", ctypes.c_int), ("srcLocHint", Loc), ("dstLocHint", Loc), ("flags", ctypes.c_uint)]
attr = Attr(1, Loc(0, 0), Loc(0, 0), 0)
batch_ok = hasattr(rt, "cudaMemcpyBatchAsync")
P = ctypes.c_void_p * n; S = ctypes.c_size_t * n
sizes = S(*([nb] * n)); idx0 = (ctypes.c_size_t * 1)(0)
def batch_way(k):
    d = P(*dp); s = P(*[hp[(k + i) % E] for i in range(n)])
    if v.value >= 13000:
        r = rt.cudaMemcpyBatchAsync(d, s, sizes, ctypes.c_size_t(n), ctypes.byref(attr), idx0, ctypes.c_size_t(1), sh)
    else:
        fail = ctypes.c_size_t(0)
        r = rt.cudaMemcpyBatchAsync(d, s, sizes, ctypes.c_size_t(n), ctypes.byref(attr), idx0, ctypes.c_size_t(1), ctypes.byref(fail), sh)
    if r and attr.srcLocHint.type == 0:  # retry once with location hints (host -> device 0)
        attr.srcLocHint, attr.dstLocHint = Loc(2, 0), Loc(1, torch.cuda.current_device())
        print("retrying batch with location hints after error", r)
        return batch_way(k)
    if r: raise RuntimeError(f"cudaMemcpyBatchAsync -> {r}")
ways = {"torch _foreach_copy_": torch_way, "ctypes cudaMemcpyAsync": ctypes_way}
if batch_ok: ways["cudaMemcpyBatchAsync"] = batch_way
# correctness
for name, fn in ways.items():
    host.random_(0, 255); slots.zero_(); torch.cuda.synchronize()
    try:
        fn(5); stream.synchronize()
        ok = all(torch.equal(slots[i].cpu(), host[(5 + i) % E]) for i in range(n))
        print(name, "correct" if ok else "WRONG")
    except Exception as ex:
        print(name, "failed", ex); ways[name] = None
ways = {k: f for k, f in ways.items() if f}
res = {k: ([], []) for k in ways}
for rep in range(15):
    for name, fn in ways.items():
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(stream); t0 = time.perf_counter(); fn(rep * 7); t1 = time.perf_counter(); e.record(stream); e.synchronize()
        res[name][0].append((t1 - t0) / n * 1e6); res[name][1].append(s.elapsed_time(e) * 1e3 / n)
for name, (h, g) in res.items():
    print(f"{name:28s} host issue {statistics.median(h):6.2f} us/copy (range {min(h):.2f}-{max(h):.2f}); wire {statistics.median(g):7.1f} us/copy = {nb / statistics.median(g) / 1e3:5.1f} GB/s")
