"""Writes into PART of a local shard chosen by position: refused where the part is chosen along a sharded dim.

`ParallelModule.parameters()` are this rank's local shards. User code that writes some elements of a parameter
after wrapping picks them by LOCAL indices: along a dim the layout shards, `weight[padding_idx]` is another row of
each shard than of the full tensor (rank 1 of fsdp dp=2 writes global row `rows/2 + padding_idx`), so the model
trains from other values than one device, silently (pytorch#139735 reports the same for DTensor:
`nn.init.zeros_(rowwise_tensor[:2])` "silent error"). Round 26 (r26b) refused the constant fills
(`weight.data[i].zero_()`, `nn.init.constant_(w[i], c)`; `init_check.CONSTANT_WRITES`); round 27 (r27g) the other
members of the class, which ran silently before (2-rank probe of a Conv1d -> Linear on fsdp dp=2 and tp=2, RESULTS
"Round 27 (r27g)"):
- index assignment, `Tensor.__setitem__`: `w.data[padding_idx] = 0`, `w[1] = 0.5` under no_grad, `w.data[[0, 2]]
  = v`, `w.data[:, :4] = 0`, and `w.data[:2] *= 0.5` (Python reads the part, multiplies it in place, and assigns
  it back: the assignment is refused, after the multiplication);
- `copy_` (and `masked_fill_`, `masked_scatter_`) into a view that is part of a shard (`w.data[:n].copy_(rows)`);
- torch.Tensor's indexed in-place writes on the shard itself (`INDEXED_WRITES`: `index_fill_`, `index_copy_`,
  `index_add_`, `index_reduce_`, `index_put_`, `scatter_`, `scatter_add_`, `scatter_reduce_`, `put_`), whose
  index tensor names local positions along `dim`, and `fill_diagonal_` (the shard's own diagonal);
- through r26b's constant fills, a view that touches every index of a sharded dim but other elements at each
  (`w.data.diagonal().fill_(1)`: every local row, the local diagonal), which r26b's rule let run;
- (r27f's members, merged onto this rule by r27fg) the same writes into a parameter's GRADIENT (`emb.weight.grad[
  padding_idx] = 0`, `p.grad[:n].zero_()`: `owner_of_memory(t, grads=True)`; a local gradient has its parameter's
  layout), `tril_` / `triu_` (the positions outside the kept triangle of the LOCAL piece), `masked_fill_` /
  `masked_scatter_` with a mask that broadcasts (fewer dims, or size 1 along a dim: every index along the dims it
  broadcasts over, its True positions along the others) on a whole shard too, and a boolean index of fewer dims
  than the tensor (`w[row_mask] = 0`: the positions it names, as torch reads it).
A write that keeps every sharded dim whole (a row of tp's column-sharded head, `w.data[:, 1] = 0` on fsdp's
row shards) or covers the whole shard (`p.data[:] = v`, `p[...] = v`) is the shard of one device's write, and runs.
Code that writes this rank's piece by local position on purpose (a test injecting an inf into one rank's
gradient) runs inside `with local_writes():`. Norms of a piece over a sharded dim are `runtime.piece_norms`.

Not checked (torch's own method runs): a part chosen by a boolean mask of the written tensor's own shape
(`w.data[w.data < 0] = 0`, `masked_fill_` with such a mask: a mask made from the values is exact on shards, one
made from positions is not, and the two cannot be told apart; a row mask made from values, `w[w[:, 0] > 0] = 0`,
is refused with the positional ones; on a view a mask is checked as the view); in-place arithmetic METHODS on a
view (`w.data[:2].mul_(0.5)`, `add_`, `clamp_`), since every optimizer's per-parameter update calls them (a wrapper
would tax each step); values made from the shard's shape (`p.copy_(torch.randn(p.shape))`); a view is judged by
the elements it holds on this rank (`w.data[:3]` holding all 3 local rows counts as whole). Remedies for all: run
the code on full tensors (`pm.apply(fn)`, `with pm.full_model() as model:`), initialise the model before
`auto_parallelize`, or `pm.load_full_state_dict(sd)`.

Which parameter (or gradient) a tensor writes into is `grad_norm.owner_of_memory` (one dictionary look-up by
storage size, then the registered parameters of that size; nothing before the first ParallelModule):
`Tensor.__setitem__`, the INDEXED_WRITES and the masked writes pay it on every call once a ParallelModule exists,
`copy_` only on views (an optimizer's or a load's whole-tensor `copy_` skips it). The decision depends on the index
and the layout only, never on this rank's piece (`_key_partial` doubles the sharded dims), so every rank raises
alike and none waits in a collective.
"""
from __future__ import annotations

import contextlib
import functools
import math

import torch

from ..core.layout import Shard
from ..errors import UnsupportedOpError
from .grad_norm import owner_of, owner_of_memory

INDEXED_WRITES = ("index_fill_", "index_copy_", "index_add_", "index_reduce_", "index_put_", "scatter_",
                  "scatter_add_", "scatter_reduce_", "put_", "fill_diagonal_", "tril_", "triu_")
"""torch.Tensor's in-place methods that write the positions an index tensor (a diagonal, a triangle) names (checked
on a shard's memory and its gradient's)."""
VIEW_WRITES = ("copy_", "masked_fill_", "masked_scatter_")
"""In-place methods checked when the receiver is a view (a part), and the masked ones also on a whole shard when
their mask is broadcast (fewer dims or size-1 dims: chosen by position); on a whole shard `copy_` is a load and a
mask of the shard's own shape is chosen by value (module docstring)."""

_LOCAL_WRITES: list[bool] = []  # non-empty inside `local_writes()`


@contextlib.contextmanager
def local_writes():
    """Positional writes inside run unchecked: for code that writes this rank's piece by LOCAL position on purpose
    (a test injecting an inf into one rank's gradient, a loader that maps global indices to local ones itself).
    Norms (`runtime.piece_norms`) stay checked. Not thread-local: it covers every thread of the process."""
    _LOCAL_WRITES.append(True)
    try:
        yield
    finally:
        _LOCAL_WRITES.pop()


def in_local_writes() -> bool:
    """Whether a `local_writes()` block is open (the constant fills of `init_check` skip their check there too)."""
    return bool(_LOCAL_WRITES)


def sharded_dims(param: torch.Tensor, owner) -> list[int]:
    """The dims of the local parameter `param` that its stored layout (`owner`: `grad_norm.Owner`) shards over a
    mesh axis of size > 1."""
    return sorted({p.dim % param.ndim for p, size in zip(owner.layout, owner.mesh.shape)
                   if isinstance(p, Shard) and size > 1})


def _whole_key(key) -> bool:
    """Whether `key` (an index as `Tensor.__getitem__` takes it) names every element: `...`, `:`, or a tuple of them."""
    items = key if isinstance(key, tuple) else (key,)
    return all(k is Ellipsis or isinstance(k, slice) and k == slice(None) for k in items)


def _by_value(key, shape) -> bool:
    """Whether `key` is one boolean mask of the written tensor's whole `shape` (`w[w.abs() < eps] = 0`): chosen by
    the values, exact on shards (a positional mask of that shape cannot be told from it: not checked)."""
    items = key if isinstance(key, tuple) else (key,)
    named = [k for k in items if k is not Ellipsis]
    return len(named) == 1 and isinstance(named[0], torch.Tensor) and named[0].dtype == torch.bool \
        and (named[0].ndim == 0 or tuple(named[0].shape) == tuple(shape))


def _mask_positions(key):
    """`key` with each boolean index of fewer dims than the tensor (a row mask `w[rows_mask]`: chosen by position
    along the dims it spans) replaced by the integer positions it names (`nonzero`), as torch reads it."""
    items = key if isinstance(key, tuple) else (key,)
    if not any(isinstance(k, torch.Tensor) and k.dtype == torch.bool and k.ndim for k in items):
        return key
    out = []
    for k in items:
        is_mask = isinstance(k, torch.Tensor) and k.dtype == torch.bool and k.ndim
        out.extend(k.cpu().nonzero(as_tuple=True) if is_mask else (k,))
    return tuple(out)


def _broadcast_mask_key(t: torch.Tensor, mask):
    """The index of `t`'s elements a `masked_fill_` / `masked_scatter_` with `mask` writes, when `mask` broadcasts
    (fewer dims, or size 1 along a dim of `t`): every index along the dims it broadcasts over (`slice(None)`: on one
    device too), its True positions along the others; None for a mask of `t`'s own shape (chosen by value) or one
    torch refuses (its own call raises)."""
    if not isinstance(mask, torch.Tensor) or mask.ndim > t.ndim or tuple(mask.shape) == tuple(t.shape):
        return None
    m = mask.cpu().reshape((1,) * (t.ndim - mask.ndim) + tuple(mask.shape))
    spread = [m.shape[d] == 1 and t.shape[d] != 1 for d in range(t.ndim)]
    if any(m.shape[d] not in (1, t.shape[d]) for d in range(t.ndim)):
        return None
    if all(spread):
        return Ellipsis if bool(m.reshape(-1)[0]) else None
    where = m.nonzero()  # (k, ndim): positions along every dim (index 0 along the broadcast ones)
    return tuple(slice(None) if spread[d] else where[:, d] for d in range(t.ndim))


def _basic_entries(key, ndim: int) -> list | None:
    """The entry of a basic `key` (ints, slices, `None`, one `...`) for each of `ndim` dims (`slice(None)` where it
    names none), or None for a key with tensors or lists (advanced indexing) or more entries than dims."""
    items = key if isinstance(key, tuple) else (key,)
    if not all(k is None or k is Ellipsis or isinstance(k, (int, slice)) and not isinstance(k, bool) for k in items):
        return None
    named = [k for k in items if k is not None]
    if named.count(Ellipsis) > 1 or len(named) - named.count(Ellipsis) > ndim:
        return None
    if Ellipsis in named:
        at = named.index(Ellipsis)
        named = named[:at] + [slice(None)] * (ndim - len(named) + 1) + named[at + 1:]
    return named + [slice(None)] * (ndim - len(named))


def _offsets(shape, strides, start: int, key) -> torch.Tensor:
    """Memory offsets (in elements) of the elements `x[key]` names, for a tensor `x` of `shape` and `strides` whose
    first element is at offset `start`: index grids expanded over `shape` (no memory) are indexed by `key`, so the
    cost is that of the selection. Raises torch's IndexError / RuntimeError for a key that does not fit `shape`."""
    ndim = len(shape)
    if ndim == 0:
        return torch.tensor([start])
    key = tuple(k.cpu() if isinstance(k, torch.Tensor) else k for k in key) if isinstance(key, tuple) else \
        (key.cpu() if isinstance(key, torch.Tensor) else key)
    offsets = torch.tensor([start])
    for k, (size, stride) in enumerate(zip(shape, strides)):
        grid = torch.arange(size).view([-1 if j == k else 1 for j in range(ndim)]).expand(tuple(shape))
        offsets = offsets + grid[key].reshape(-1) * stride
    return offsets


def _not_a_product(offsets: torch.Tensor, shape, dims: list[int]) -> bool:
    """Whether the elements at contiguous `offsets` into `shape` are NOT every index of `dims` times some set over
    the other dims (the only selections that are the shard of one device's selection along `dims`)."""
    flat = offsets.unique()
    if flat.numel() == 0:
        return False
    if int(flat.min()) < 0 or int(flat.max()) >= math.prod(shape):
        return True
    coords = torch.unravel_index(flat, tuple(shape))
    rest = [coords[d] for d in range(len(shape)) if d not in dims]
    kept = torch.stack(rest).unique(dim=1).shape[1] if rest else 1
    return flat.numel() != kept * math.prod(shape[d] for d in dims)


def _key_partial(shape, key, dims: list[int]) -> bool:
    """Whether `key` on a tensor of `shape` whose `dims` are sharded picks a part along them: decided on index grids
    whose sharded dims have 2n + 2 positions, so that a key that happens to cover this rank's n positions (`w[:3]`
    on 3 local rows, `w[-1]`) counts as the positional part it is on one device, and every rank decides alike."""
    if _whole_key(key):
        return False
    grown = tuple(2 * n + 2 if d in dims else n for d, n in enumerate(shape))
    per_dim = _basic_entries(key, len(shape))
    if per_dim is not None:  # ints / slices / None / ...: a product of per-dim choices, decided dim by dim
        try:
            return any(torch.arange(grown[d])[per_dim[d]].numel() < grown[d] for d in dims)
        except (IndexError, RuntimeError, TypeError, ValueError):
            return False
    strides = [math.prod(grown[d + 1:]) for d in range(len(grown))]
    try:
        return _not_a_product(_offsets(grown, strides, 0, key), grown, dims)
    except (IndexError, RuntimeError, TypeError, ValueError):  # a key torch refuses too: its own error follows
        return False


def partial_along_sharded(t: torch.Tensor, param: torch.Tensor, owner, key=Ellipsis) -> bool:
    """Whether `t[key]` (`t`: a tensor in the memory of the registered local parameter `param`, e.g. `param`,
    `param.data` or a view of it; `key`: `...` for all of `t`) leaves out some index of a dim `param`'s layout
    shards, or picks other elements along the other dims at different indices of a sharded dim (a diagonal).

    `t` laid out as `param` (itself or `.data`): decided from the key alone (`_key_partial`). A view: from the memory
    offsets of its elements in the contiguous `param`; one that cannot be placed so (another dtype, a
    non-contiguous parameter) counts as partial unless it spans the parameter's bytes with `key` whole. A boolean
    mask is not checked (module docstring)."""
    dims = sharded_dims(param, owner)
    if not dims or _by_value(key, t.shape):
        return False
    key = _mask_positions(key)
    if t.data_ptr() == param.data_ptr() and t.dtype == param.dtype and t.shape == param.shape \
            and t.stride() == param.stride():
        return _key_partial(tuple(t.shape), key, dims)
    if t.numel() == 0:
        return False
    if t.dtype != param.dtype or not param.is_contiguous():
        return not _whole_key(key) or t.numel() * t.element_size() != param.numel() * param.element_size()
    start = (t.data_ptr() - param.data_ptr()) // param.element_size()
    try:
        offsets = _offsets(tuple(t.shape), t.stride(), start, key)
    except (IndexError, RuntimeError, TypeError, ValueError):
        return False
    return _not_a_product(offsets, tuple(param.shape), dims)


def refuse_part(call: str, owner, example: str, piece: torch.Tensor | None = None) -> UnsupportedOpError:
    """The error for `call` (e.g. "Tensor.__setitem__") writing a positional part of the local shard of `owner`;
    `example`: the call on the full model, for the remedy; `piece`: the local parameter or gradient written (its
    shape, and whether it is a gradient, go into the message)."""
    what = "the gradient of " if piece is not None and owner_of(piece) is None else ""
    holds = f"this rank holds {tuple(piece.shape)} of {owner.shape}, " if piece is not None and owner.shape else ""
    return UnsupportedOpError(
        f"{call} on part of {what}{owner.fqn!r}, a local shard ({holds}stored as {owner.layout} on mesh "
        f"{owner.mesh}): the part is chosen by indices into this rank's shard along a sharded dim, so it is another "
        "part of the parameter on every rank than on one device (e.g. weight[padding_idx] is a different row of each "
        f"shard). Remedy: run it on full tensors: pm.apply(init_fn), or `with pm.full_model() as model: {example}`; "
        "or initialise the model before auto_parallelize (or load values with pm.load_full_state_dict); a write of "
        "this rank's piece by local position on purpose: inside `with parallelizer.runtime.part_writes."
        "local_writes():`")


def _indexed_key(name: str, t: torch.Tensor, args: tuple, kwargs: dict):
    """The index (as `Tensor.__getitem__` takes it) of the elements INDEXED_WRITES method `name` writes, from its
    arguments; None when they do not parse (torch's own call then raises)."""
    try:
        if name == "index_put_":
            indices = args[0] if args else kwargs["indices"]
            return tuple(slice(None) if i is None else i for i in indices)
        if name == "fill_diagonal_":  # the positions torch fills, marked on a boolean tensor of t's shape
            wrap = args[1] if len(args) > 1 else kwargs.get("wrap", False)
            return torch.zeros(t.shape, dtype=torch.bool).fill_diagonal_(True, wrap=wrap).nonzero(as_tuple=True)
        if name in ("tril_", "triu_"):  # the positions torch zeroes: outside the kept triangle
            diagonal = args[0] if args else kwargs.get("diagonal", 0)
            ones = torch.ones(t.shape[-2:], dtype=torch.bool)
            kept = ones.triu(diagonal) if name == "triu_" else ones.tril(diagonal)
            return (~kept).expand(t.shape).nonzero(as_tuple=True) if t.ndim >= 2 else None
        if name == "put_":
            index = (args[0] if args else kwargs["index"]).reshape(-1) % max(t.numel(), 1)
            return torch.unravel_index(index, tuple(t.shape))
        dim = (args[0] if args else kwargs["dim"]) % max(t.ndim, 1)
        index = args[1] if len(args) > 1 else kwargs["index"]
        if name.startswith("index_"):
            return (slice(None),) * dim + (index.reshape(-1),)
        return tuple(index if d == dim else torch.arange(index.shape[d]).view(
            [-1 if j == d else 1 for j in range(index.ndim)]) for d in range(index.ndim))
    except (IndexError, KeyError, AttributeError, TypeError, RuntimeError):
        return None


def _checked_setitem(original):
    @functools.wraps(original)
    def __setitem__(self, key, value):
        held = None if _LOCAL_WRITES else owner_of_memory(self, grads=True)  # `emb.weight.grad[i] = 0` too
        if held is not None and partial_along_sharded(self, held[0], held[1], key):
            error = refuse_part("Tensor.__setitem__ (index assignment `w[...] = v`)", held[1],
                                "model.<name>.data[...] = v", held[0])
            if isinstance(value, torch.Tensor) and owner_of_memory(value) is not None:
                # `w[i] *= c`: Python changed the part in place (`__imul__` on `w[i]`) before assigning it back
                error.args = (error.args[0] + ". An augmented assignment (`w[i] *= c`) has already changed this "
                              "rank's part before this check: restore the parameter (pm.load_full_state_dict)",)
            raise error
        return original(self, key, value)

    __setitem__._parallelizer_checked = True
    return __setitem__


def _checked_write(name: str, original):
    @functools.wraps(original)
    def write(self, *args, **kwargs):
        whole_copy = name == "copy_" and self._base is None  # a load or an optimizer's update: not looked up
        held = None if _LOCAL_WRITES or whole_copy else owner_of_memory(self, grads=True)
        if held is not None:
            if name in INDEXED_WRITES:
                key = _indexed_key(name, self, args, kwargs)
            elif name != "copy_":  # masked_fill_ / masked_scatter_: a broadcast mask chooses by position
                key = _broadcast_mask_key(self, args[0] if args else kwargs.get("mask"))
                key = Ellipsis if key is None and self._base is not None else key
            else:
                key = Ellipsis
        if held is not None and key is not None and partial_along_sharded(self, held[0], held[1], key):
            raise refuse_part(f"Tensor.{name}", held[1], f"model.<name>.data.{name}(...)", held[0])
        return original(self, *args, **kwargs)

    write._parallelizer_checked = True
    return write


def install() -> None:
    """Wrap `Tensor.__setitem__`, the INDEXED_WRITES and the VIEW_WRITES methods of torch.Tensor (once per process);
    on a tensor outside every registered parameter's (and gradient's) memory each calls torch's own method after one
    look-up (`grad_norm.owner_of_memory`)."""
    if not getattr(torch.Tensor.__setitem__, "_parallelizer_checked", False):
        torch.Tensor.__setitem__ = _checked_setitem(torch.Tensor.__setitem__)
    for name in INDEXED_WRITES + VIEW_WRITES:
        original = getattr(torch.Tensor, name)
        if not getattr(original, "_parallelizer_checked", False):
            setattr(torch.Tensor, name, _checked_write(name, original))
