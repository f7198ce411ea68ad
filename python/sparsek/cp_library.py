"""cp_attention(exchange="library"): the library's own CUDA run
(sk_cp_forward) over the NCCL communicator of a torch.distributed group.

The torch path (cp_torch.py) exchanges with torch.distributed and runs
the passes as separate sparsek.attention calls; this one hands the whole
rank's run to sk_cp_forward, which packs and exchanges on the
communicator's side stream while the local passes run, and merges the
remote passes by carry-in on Hopper (docs/perf/context_parallel.md, the
CUDA run). The communicator is torch's own: ProcessGroupNCCL._comm_ptr()
(torch >= 2.8), wrapped by sk_comm_create_nccl. libsparsek opens
libnccl.so.2 by name, which resolves to the NCCL that torch already loaded
in the process, so the handle and the functions come from one library.

Cached per (plan, rank, device, communicator), once: the sk_comm_t, the
workspace (sk_cp_workspace_size bytes, a torch tensor) and sk_cp_prepare's
upload of the plan into it. The shards must be packed [B, S_r, H, D]
(made contiguous when they are not); out must be contiguous.
"""

from __future__ import annotations

import weakref
from ctypes import byref, c_size_t, c_void_p

import torch
import torch.distributed as dist

from ._lib import Backend, F, check


def _comm_pointer(group, device) -> int:
    """The ncclComm_t of `group` on `device`, initialising it when torch
    has not yet (torch creates NCCL communicators on first use)."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    backend = pg._get_backend(device)
    get = getattr(backend, "_comm_ptr", None)
    if get is None:
        raise ValueError("exchange = 'library' needs ProcessGroupNCCL._comm_ptr() (torch 2.8 or later); "
                         "use 'all_to_all' or 'p2p'")
    ptr = int(get())
    if ptr == 0:
        dist.all_reduce(torch.zeros(1, device=device), group=group)
        ptr = int(get())
    if ptr == 0:
        raise RuntimeError("group: torch returned no NCCL communicator for this device")
    return ptr


class _LibraryState:
    """One rank's communicator handle, workspace and prepared plan."""

    def __init__(self, plan, rank: int, device, ptr: int):
        self.desc = plan.desc(rank)
        self.desc.backend = Backend.CUDA
        handle = c_void_p()
        check(F.sk_comm_create_nccl(c_void_p(ptr), byref(handle)))
        self.comm = handle
        self._finalizer = weakref.finalize(self, F.sk_comm_destroy, handle)
        size = c_size_t()
        check(F.sk_cp_workspace_size(byref(self.desc), plan.address, plan.nbytes, byref(size)))
        self.size = size.value
        # 256-byte aligned (torch's CUDA allocator aligns to 512).
        self.workspace = torch.empty(max(self.size, 1), dtype=torch.uint8, device=device)
        stream = torch.cuda.current_stream(device).cuda_stream
        check(F.sk_cp_prepare(byref(self.desc), plan.address, plan.nbytes, self.workspace.data_ptr(),
                              self.size, stream))


def run(q, k, v, plan, group, rank: int, out, lse):
    """sk_cp_forward of this rank into out and lse (both allocated by the
    caller, cp_torch.cp_attention)."""
    device = q.device
    if device.type != "cuda":
        raise ValueError("exchange = 'library' runs CUDA tensors over an NCCL group")
    if not out.is_contiguous():
        raise ValueError("out must be contiguous with exchange = 'library' (a packed [B, S_r, Hq, D] shard)")
    q, k, v = (x.contiguous() for x in (q, k, v))
    with torch.cuda.device(device):
        ptr = _comm_pointer(group, device)
        cache = plan.__dict__.setdefault("_library_states", {})
        key = (rank, str(device), ptr)
        if key not in cache:
            cache[key] = _LibraryState(plan, rank, device, ptr)
        st = cache[key]
        stream = torch.cuda.current_stream(device).cuda_stream
        check(F.sk_cp_forward(byref(st.desc), plan.address, plan.nbytes, st.comm, q.data_ptr(), k.data_ptr(),
                              v.data_ptr(), out.data_ptr(), lse.data_ptr(), st.workspace.data_ptr(), st.size,
                              stream))
    return out, lse
