"""sparsek.attention_backward and AttentionBackwardPlan: the gradients of
sparsek.attention with respect to q, k and v (sk_attention_backward_*).

The backward takes what the forward returned: o and lse (lse from
attention(..., return_lse=True)), plus do = dL/do, and gives (dq, dk, dv)
with dk, dv summed over the query heads of each KV head (GQA). Same data
families as the forward: numpy arrays on the CPU backend (float16, float32,
bfloat16 through ml_dtypes), torch CPU tensors on the CPU backend, torch
CUDA tensors on the CUDA backend (the portable sm80 backward kernels on
every CUDA GPU, Hopper included, until a Hopper backward exists).

AttentionBackwardPlan holds the descriptors, the layout on the data's
device, the workspace and the plan, so that a caller that runs many
backward passes on one layout plans once; run() only checks its arrays and
calls sk_attention_backward_run. attention_backward and the torch op's
backward (torch_ops.py) take their plans from the plan cache
(plan_cache.py).
Every argument is checked here before the library is called (ValueError /
TypeError); what the library finds itself raises SparseKError.
"""

from __future__ import annotations

from ctypes import byref, c_size_t, sizeof

from ._arrays import Arr, adapt, check_family, check_packed, outer_strides
from ._lib import Backend, DType, F, SkAttentionBackwardDesc, check
from .attention import _Spec, _attention_desc, _check_like, _check_qkv, _empty_like, _options, _problem_key, write_strides
from .layout_arrays import of_layout
from .plan_cache import cached_plan


def _check_lse(lse, aq: Arr) -> Arr:
    """lse: float32 [B, Hq, Sq], contiguous, on q's device."""
    a = adapt(lse, "lse")
    check_family((aq, a))
    B, Sq, Hq, _ = aq.shape
    if a.shape != (B, Hq, Sq):
        raise ValueError(f"lse has shape {a.shape}; it must be [B, Hq, Sq] = {(B, Hq, Sq)}")
    if a.dtype != DType.F32:
        raise TypeError(f"lse.dtype = {a.dtype_name} must be float32 (as the forward returns it)")
    if a.device != aq.device:
        raise ValueError(f"lse is on {a.device} but q is on {aq.device}")
    check_packed(a, "lse", "[B, Hq, Sq]")
    return a


class AttentionBackwardPlan:
    """A planned attention backward: both descriptors, the layout on the
    data's device, workspace and the plan (sk_attention_backward_plan),
    made once; run() then only calls sk_attention_backward_run. Inputs to
    run() must have the planned shapes, dtype and device (strides may
    differ; the last dimension is contiguous). deterministic=True (the
    default) gives bitwise repeatable gradients; False allows the faster
    fused pass on a CUDA GPU (Hopper's, or the portable kernel's on other
    GPUs and the sm80 backend; dQ summed with fp32 atomics: last-bit
    differences from run to run; dK, dV still repeatable, a larger
    workspace); elsewhere (CPU, varlen) it gives the deterministic results."""

    def __init__(self, q, k, v, layout, *, causal=False, scale=None, backend=None, deterministic=True):
        aq, ak, _ = _check_qkv(q, k, v)
        self.backend, self.desc = _attention_desc(aq, ak, layout, causal, scale, backend)
        self.layout = layout
        self.causal = bool(causal)
        self.spec = _Spec(aq.kind, aq.device, aq.dtype, aq.dtype_name, aq.shape, ak.shape)
        bwd = SkAttentionBackwardDesc()
        check(F.sk_attention_backward_desc_init(byref(bwd), sizeof(bwd)))
        bwd.deterministic = 1 if deterministic else 0
        self.bwd = bwd
        self._strides = None  # what run() wrote into desc and bwd last

        self._torch_device = None
        if self.backend == Backend.CPU:
            self.bsr = layout.view()
            self.workspace, self.workspace_size = None, 0
        else:
            import torch

            self._torch_device = q.device
            with torch.cuda.device(q.device):
                self.bsr = layout.device_view(q.device)
                size = c_size_t()
                check(F.sk_attention_backward_workspace_size(byref(self.desc), byref(bwd), byref(self.bsr), byref(size)))
                self.workspace_size = size.value
                self.workspace = torch.empty(max(size.value, 1), dtype=torch.uint8, device=q.device)
        self.replan()

    def replan(self) -> None:
        """Enqueue sk_attention_backward_plan again (after the layout's
        device arrays changed content); on torch's current stream."""
        if self.backend == Backend.CPU:
            check(F.sk_attention_backward_plan(byref(self.desc), byref(self.bwd), byref(self.bsr), None, 0, None))
            return
        import torch

        with torch.cuda.device(self._torch_device):
            stream = torch.cuda.current_stream(self._torch_device).cuda_stream
            check(
                F.sk_attention_backward_plan(
                    byref(self.desc), byref(self.bwd), byref(self.bsr), self.workspace.data_ptr(), self.workspace_size,
                    stream,
                )
            )

    def run(self, q, k, v, o, do, lse, *, dq=None, dk=None, dv=None):
        """Enqueue sk_attention_backward_run. o and lse as the forward
        returned them for these q, k, v; do = dL/do (q's shape). dq (q's
        shape), dk and dv (k's shape) are allocated when None. Returns
        (dq, dk, dv)."""
        aq, ak, av = _check_qkv(q, k, v)
        sp = self.spec
        if (aq.kind, aq.device, aq.dtype, aq.shape, ak.shape) != (sp.kind, sp.device, sp.dtype, sp.q_shape, sp.kv_shape):
            raise ValueError(
                f"run() got q {aq.shape} / k {ak.shape} {aq.dtype_name} on {aq.device}; the plan was made "
                f"for q {sp.q_shape} / k {sp.kv_shape} {sp.dtype_name} on {sp.device}"
            )
        ao = _check_like(o, aq, "q", "o", False)
        ado = _check_like(do, aq, "q", "do", False)
        alse = _check_lse(lse, aq)
        # Outputs allocated here need no checks.
        dq, adq = (_empty_like(q, aq), None) if dq is None else (dq, _check_like(dq, aq, "q", "dq", True))
        dk, adk = (_empty_like(k, ak), None) if dk is None else (dk, _check_like(dk, ak, "k", "dk", True))
        dv, adv = (_empty_like(v, av), None) if dv is None else (dv, _check_like(dv, ak, "k", "dv", True))
        adq, adk, adv = (a or adapt(x, n) for a, x, n in ((adq, dq, "dq"), (adk, dk, "dk"), (adv, dv, "dv")))
        desc, bwd = self.desc, self.bwd
        arrays = ((aq, "q"), (ak, "k"), (av, "v"), (ao, "o"), (ado, "do"), (adq, "dq"), (adk, "dk"), (adv, "dv"))
        strides = tuple(outer_strides(a, name) for a, name in arrays)
        if strides != self._strides:
            write_strides(desc, ("q_strides", "k_strides", "v_strides", "o_strides"), strides[:4], None)
            write_strides(bwd, ("dout_strides", "dq_strides", "dk_strides", "dv_strides"), strides[4:], None)
            self._strides = strides
        ptrs = [a.ptr for a in (aq, ak, av, ao, ado, alse, adq, adk, adv)]
        if self.backend == Backend.CPU:
            check(F.sk_attention_backward_run(byref(desc), byref(bwd), byref(self.bsr), *ptrs, None, 0, None))
            return dq, dk, dv
        import torch

        with torch.cuda.device(self._torch_device):
            stream = torch.cuda.current_stream(self._torch_device).cuda_stream
            check(
                F.sk_attention_backward_run(
                    byref(desc), byref(bwd), byref(self.bsr), *ptrs, self.workspace.data_ptr(), self.workspace_size, stream
                )
            )
        return dq, dk, dv


def plan_attention_backward(q, k, v, layout, *, causal=False, scale=None, backend=None, deterministic=True):
    """Plan once; call .run(q, k, v, o, do, lse) as often as needed."""
    return AttentionBackwardPlan(q, k, v, layout, causal=causal, scale=scale, backend=backend, deterministic=deterministic)


def cached_backward_plan(q, k, v, arrays, *, causal=False, scale=None, backend=None, deterministic=True, strides=()):
    """The AttentionBackwardPlan for these inputs over `arrays`
    (layout_arrays.LayoutArrays), from the plan cache (plan_cache.py).
    strides: those of o, do and any caller's dq, dk, dv."""
    aq, ak, av = _check_qkv(q, k, v)
    be, sc = _options(aq, scale, backend)
    key = ("bwd", bool(deterministic), strides) + _problem_key(aq, ak, av, causal, sc, be)
    return cached_plan(
        arrays, key, aq.device,
        lambda: AttentionBackwardPlan(q, k, v, arrays.borrow(), causal=causal, scale=scale, backend=backend,
                                      deterministic=deterministic),
    )


def attention_backward(q, k, v, o, do, lse, layout, causal=False, scale=None, *, dq=None, dk=None, dv=None,
                       backend=None, deterministic=True):
    """Gradients of sparsek.attention with respect to q, k and v.

    q [B, Sq, Hq, D], k and v [B, Sk, Hkv, D], layout, causal and scale as
    given to the forward; o and lse [B, Hq, Sq] (float32) as the forward
    returned them (attention(..., return_lse=True)); do = dL/do, q's shape
    and dtype. Returns (dq, dk, dv) in the inputs' dtype: dq q's shape, dk
    and dv k's shape, summed over the query heads of each KV head. Rows with
    no admissible key get dq = 0; keys no row reaches get dk = dv = 0.
    dq, dk, dv: optional outputs (writable, last dimension contiguous).
    The plan is cached per layout, problem and stream (plan_cache.py).
    """
    aq = _check_qkv(q, k, v)[0]
    arrays = of_layout(layout, aq.device)
    # run() writes these strides into the plan's descriptors: a plan serves
    # one set of them, so that calls sharing it never disagree.
    strides = tuple(None if x is None else adapt(x, name).strides
                    for x, name in ((o, "o"), (do, "do"), (dq, "dq"), (dk, "dk"), (dv, "dv")))
    plan = cached_backward_plan(q, k, v, arrays, causal=causal, scale=scale, backend=backend,
                                deterministic=deterministic, strides=strides)
    return plan.run(q, k, v, o, do, lse, dq=dq, dk=dk, dv=dv)


__all__ = ["attention_backward", "plan_attention_backward", "AttentionBackwardPlan", "cached_backward_plan"]
