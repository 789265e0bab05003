"""The few OpenCL calls the host-array conveniences need (buffers in and out), through the same
OpenCL ICD loader libclmla links. Internal: clmla.latent_attention and Sequence.append use them."""

from __future__ import annotations

import ctypes

import numpy as np

_cl = None

CL_MEM_READ_WRITE = 1 << 0
CL_MEM_COPY_HOST_PTR = 1 << 5


def _lib():
    global _cl
    if _cl is None:
        cl = ctypes.CDLL("libOpenCL.so.1")
        vp, sz, i32, u32, u64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int32, ctypes.c_uint32, ctypes.c_uint64
        cl.clCreateBuffer.restype = vp
        cl.clCreateBuffer.argtypes = [vp, u64, sz, vp, ctypes.POINTER(i32)]
        for name in ("clEnqueueReadBuffer", "clEnqueueWriteBuffer"):
            f = getattr(cl, name)
            f.restype = i32
            f.argtypes = [vp, vp, u32, sz, sz, vp, u32, vp, vp]
        cl.clReleaseMemObject.restype = i32
        cl.clReleaseMemObject.argtypes = [vp]
        cl.clFinish.restype = i32
        cl.clFinish.argtypes = [vp]
        cl.clReleaseEvent.restype = i32
        cl.clReleaseEvent.argtypes = [vp]
        _cl = cl
    return _cl


class Buffers:
    """Device buffers made from host arrays on one context, released together."""

    def __init__(self, cl_context, queue, fail):
        self.ctx, self.queue, self.fail = cl_context, queue, fail
        self.mems = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def upload(self, array: np.ndarray) -> int:
        """A buffer holding a copy of array (at least 4 bytes, so that empty arrays get a buffer)."""
        cl = _lib()
        err = ctypes.c_int32(0)
        a = np.ascontiguousarray(array)
        n = max(a.nbytes, 4)
        if a.nbytes:
            mem = cl.clCreateBuffer(self.ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n, a.ctypes.data,
                                    ctypes.byref(err))
        else:
            mem = cl.clCreateBuffer(self.ctx, CL_MEM_READ_WRITE, n, None, ctypes.byref(err))
        if not mem or err.value:
            self.fail(err.value or -4, "clCreateBuffer of %d bytes failed" % n)
        self.mems.append(mem)
        return mem

    def empty(self, nbytes: int) -> int:
        cl = _lib()
        err = ctypes.c_int32(0)
        mem = cl.clCreateBuffer(self.ctx, CL_MEM_READ_WRITE, max(int(nbytes), 4), None, ctypes.byref(err))
        if not mem or err.value:
            self.fail(err.value or -4, "clCreateBuffer of %d bytes failed" % nbytes)
        self.mems.append(mem)
        return mem

    def download(self, mem: int, out: np.ndarray) -> np.ndarray:
        """Blocking read of mem into out (C-contiguous)."""
        if out.nbytes:
            rc = _lib().clEnqueueReadBuffer(self.queue, mem, 1, 0, out.nbytes, out.ctypes.data, 0, None, None)
            if rc:
                self.fail(rc, "clEnqueueReadBuffer failed")
        return out

    def finish(self):
        rc = _lib().clFinish(self.queue)
        if rc:
            self.fail(rc, "clFinish failed")

    def release(self):
        if self.mems:
            cl = _lib()
            cl.clFinish(self.queue)
            for m in self.mems:
                cl.clReleaseMemObject(m)
            self.mems = []


def release_event(event):
    if event:
        _lib().clReleaseEvent(event)
