"""Graph normalisations applied right after export, each recorded in `TracedGraph.notes`.

1. Shape-assertion nodes (`_assert_tensor_metadata` and friends: no outputs, no users) are dropped.
2. (`tracer/regions.py`) A `torch.no_grad()` / `torch.enable_grad()` region inside forward is inlined as a
   stop-gradient (its inputs, but those it writes in place, and its outputs go through `aten.detach`), and a
   `torch.autocast(...)` region is inlined with autocast's casts made explicit.
3. (`tracer/device_free.py`) What export records on some devices only, so that a model traced on meta and on
   CPU gives one graph: every `aten.view` becomes `aten.reshape`; `aten.contiguous` (memory layout only) is
   dropped; a Python number wrapped as a tensor is `scalar_tensor(v)`, and a 0-dim value written into a slice
   is `fill_`; `aten.lift_fresh_copy` of a constant created in forward that nothing writes through is the
   constant, and `aten.detach_` of a graph input or constant that carries no gradient is removed (`type_as` of
   a constant is `to`: 9). Last of all (in `tracer.trace`), lifted constants and op nodes are renumbered in
   graph order, so that names do not depend on what was removed.
4. Biases are split off linear layers: `aten.linear(x, W, b)` becomes `aten.add(aten.linear(x, W), b)` and
   `aten.addmm(b, x, W)` becomes `aten.add(aten.mm(x, W), b)`. Sharding rules then see the bias as its own
   use: under row-parallel tensor parallelism the matmul's output is Partial and the bias is added once,
   after the all-reduce (adding it inside the matmul would add it once per rank). The add is marked
   (`SPLIT_BIAS`): the emitted program adds the bias cast to the product's dtype, as linear / addmm do under
   a torch.autocast the trace did not see (a user's autocast around pm(...)); a plain add promoted the bf16
   product to float32 there, so every biased Linear's output (the MLP's 4h-wide activation) was float32.
5. (`tracer/fresh_writes.py`) An in-place op writing a FRESH activation (`loss += aux_loss` in transformers' MoE models, `F.relu(x,
   inplace=True)` on a conv output) becomes its out-of-place form, and the readers of the written value after
   the write read the new result: fresh = the output of a compute op that is neither a view nor itself an
   in-place write (so it aliases no parameter, buffer, input or other value) and that no view aliases, or a
   view of one that only that view reads (`nn.Dropout(inplace=True)` on `pooled.flatten(1)`, MobileNetV2's
   classifier: its dropout_ had no rule and ran replicated, and under 'ddp' the plan was infeasible). The
   planner never redistributes a value written in place (`planner.edge_roles.mutation_edges`), which is right
   for state but made `loss += aux` on a Partial (a mean loss over a sharded batch) unplannable under 'ddp'
   (InfeasiblePlanError on cross_entropy_loss); the out-of-place form computes the same values.
6. (Applied first, in every region's body too.) An `out=` variant (`torch.div(a, b, out=buf)`;
   `F.normalize(..., out=u)` in `nn.utils.spectral_norm`'s power iteration, which writes its `u`/`v` buffers)
   becomes its functional overload followed by `aten.copy_(buf, result)`, and readers of the op's result read
   the copy: the write is then an ordinary in-place write of `buf` (kept where `buf` lives, not detached in a
   no-grad region). The planner's rules know functional ops, whose tensor arguments are all inputs; an `out`
   keyword was taken for an extra input (IndexError inside strategy enumeration).
7. (Applied before 3.) `aten.as_strided(x, size, stride, offset)` reads x's STORAGE at the traced strides and
   offset, but the sharded program re-materialises values (a collective's result is a fresh tensor, a slice
   of a gathered value has its own offset), so the same op read other elements there: an `as_strided` of a
   transposed activation was off by 2.1 on every mesh, one of `h[:, 1:]` raised torch's setStorage error.
   It is rewritten so that it reads the VALUES of x: when x is contiguous in the trace,
   `as_strided(clone(x), size, stride, offset - x's offset)`; otherwise x is first scattered into a zero
   buffer at its traced storage positions (`new_zeros` + `as_strided_scatter`), which as_strided then reads.
   An as_strided that reads storage outside x's own elements (memory of the tensor x is a view of) has no
   such form: `TraceError` naming it, with a remedy.
8. (`tracer/cache_output.py`, after 3.) What building a key/value cache adds to a graph traced with the
   model's own `use_cache=True` (the cache itself is dropped from the output): `cat` operands with no elements
   are removed (a `cat` of one operand is that operand), then ops whose values reach no output and that write
   nothing a kept op or a placeholder reads (dead code; random draws kept).
9. Twins of ops with sharding rules become those ops: torch's aliases (`ALIASES`: `concat` / `concatenate` of
   `cat`, `clip` of `clamp`, `multiply` of `mul`, `swapaxes` of `transpose`, ... which torch.export keeps under
   their own names and which had no rule: LayoutLMv3's `clip` ran replicated and gathered the batch under ddp)
   become the ops they alias, and `aten.reshape_as(x, other)` / `aten.view_as(x, other)` become
   `aten.reshape(x, other's traced shape)` (GOT-OCR2, LeViT, ZoeDepth: they ran replicated, without a rule,
   and under ddp gathered the batch); `aten.type_as(x, other)` becomes `aten.to.dtype(x, other's dtype)` (it
   reads only other's dtype, but its rule took other as an elementwise operand: PegasusX's positional
   encoding, `arange(...).type_as(inputs_embeds)`, gathered the batch-sharded embeddings under ddp).
10. A batch-first recurrent layer (`nn.LSTM / GRU / RNN(batch_first=True)`, the usual way to write one) becomes
   the sequence-first op between two transposes (torch's batch-first kernel transposes the same way inside):
   the op's output holds the batch on dim 1 like its states, so the batch can be sharded (one option gives
   every output one placement); batch-first calls ran replicated and under ddp gathered the batch.
12. Rows flattened around row-wise ops and unflattened again (`nn.MultiheadAttention`'s out-projection:
   `(L, N, H, D) or (L, N*H, D) -> reshape (L*N, E) -> linear -> add bias -> reshape (L, N, E)`) keep (L, N):
   the first reshape becomes `reshape(x, (L, N, E))` and the last one is dropped, the linear / bias add / unary
   pointwise ops between them run on the 3-D value (linear folds leading dims itself: the same matmul). A
   batch on dim 1 (N) merged into L*N is no Shard of the flat rows, so under "ddp" the flat form forced an
   all-to-all to L and back per attention layer (round 18 (g), a ViT of nn.TransformerEncoderLayer: all_to_all
   x4 on dp=2).
11. (`tracer/bags.py`) An embedding bag of fixed-size bags (`nn.EmbeddingBag` on a 2-D index tensor) becomes
   embedding + sum / mean / amax over the bag dim (same values and weight gradient; it ran replicated).
"""
from __future__ import annotations

import operator

import torch
import torch.fx

from ..errors import TraceError
from .bags import fixed_bags_as_embedding
from .cache_output import drop_dead_code, drop_empty_cat_operands
from .device_free import drop_contiguous, uncopied_constants, views_as_reshapes, wrapped_scalars
from .fresh_writes import out_of_place_fresh_writes
from .node_facts import draws_random, meta_like as _meta_like, mutated_args, stack_location
from .regions import autocast_failure, inline_regions  # noqa: F401 (autocast_failure: re-exported)

_ASSERT_OPS = {
    torch.ops.aten._assert_tensor_metadata.default,
    torch.ops.aten._assert_scalar.default,
    torch.ops.aten.sym_constrain_range_for_size.default,
}


def normalize(gm: torch.fx.GraphModule, notes: list[str], constants: dict[str, torch.Tensor] | None = None) -> None:
    """Apply the normalisations of the module docstring to `gm` in place and recompile it. `constants`:
    placeholder name -> value of each lifted tensor constant (normalisation 3 reads wrapped Python numbers)."""
    _functional_out_variants(gm, notes)
    inline_regions(gm, notes)
    _layout_free_as_strided(gm, notes)
    _drop_asserts(gm, notes)
    _device_free(gm, notes, constants or {})
    _drop_cache_leftovers(gm, notes)
    _split_biases(gm, notes)
    _twins(gm, notes)
    _sequence_first_rnns(gm, notes)
    _unflattened_rows(gm, notes)
    fixed_bags_as_embedding(gm, notes)
    out_of_place_fresh_writes(gm, notes)
    gm.graph.lint()
    gm.recompile()


def _functional_out_variants(gm: torch.fx.GraphModule, notes: list[str]) -> None:
    """Normalisation 6 (module docstring), in `gm` and in every submodule graph (region bodies)."""
    aten = torch.ops.aten
    rewritten: dict[str, int] = {}
    for module in gm.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in list(module.graph.nodes):
            schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
            if schema is None or not schema.name.startswith("aten::"):
                continue
            outs = [a for a in schema.arguments if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write]
            if not outs:
                continue
            name = schema.name.split("::")[-1]
            where = stack_location(node)
            functional = _out_free_overload(schema) if len(outs) == 1 else None
            buf = node.kwargs.get(outs[0].name)
            val = node.meta.get("val")
            if (functional is None or not isinstance(buf, torch.fx.Node) or not isinstance(val, torch.Tensor)
                    or not isinstance(buf.meta.get("val"), torch.Tensor) or buf.meta["val"].shape != val.shape
                    or buf.meta["val"].dtype != val.dtype):
                raise TraceError(f"an `out=` op without a functional form (aten.{name}.{node.target._overloadname}, "
                                 f"node {node.name})", where,
                                 "assign the result (`y = op(...)`, then `buf.copy_(y)` if a buffer must be "
                                 "updated) instead of passing `out=`",
                                 "no overload of the op without `out` gives the same result shape and dtype")
            kwargs = {k: v for k, v in node.kwargs.items() if k != outs[0].name}
            with module.graph.inserting_before(node):
                result = module.graph.call_function(functional, node.args, kwargs)
                result.meta = _meta_like(node)
                copy = module.graph.call_function(aten.copy_.default, (buf, result))
                copy.meta = _meta_like(node)
            node.replace_all_uses_with(copy)
            module.graph.erase_node(node)
            rewritten[name] = rewritten.get(name, 0) + 1
        if module is not gm:
            module.graph.lint()
            module.recompile()
    if rewritten:
        notes.append("wrote `out=` op(s) as their functional form + copy_ into the out tensor: "
                     + ", ".join(f"{k} x{v}" for k, v in sorted(rewritten.items())))


_AS_STRIDED_CHECK_MAX = 1 << 24  # elements: above, a non-contiguous input's positions are not enumerated


def _layout_free_as_strided(gm: torch.fx.GraphModule, notes: list[str]) -> None:
    """Normalisation 7 (module docstring)."""
    aten = torch.ops.aten
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.as_strided.default:
            continue
        x, size, stride = node.args[:3]
        offset = node.args[3] if len(node.args) > 3 else node.kwargs.get("storage_offset")
        xv, val = x.meta.get("val") if isinstance(x, torch.fx.Node) else None, node.meta.get("val")
        if not isinstance(xv, torch.Tensor) or not isinstance(val, torch.Tensor) or val.numel() == 0:
            continue
        if not all(isinstance(v, int) for v in (*size, *stride, *xv.shape, *xv.stride())) or \
                not isinstance(xv.storage_offset(), int) or not isinstance(offset, (int, type(None))):
            continue  # symbolic shapes: left as traced
        x_offset = xv.storage_offset()
        offset = x_offset if offset is None else offset
        where = stack_location(node)

        def refuse(why: str):
            raise TraceError(f"as_strided reading memory around its input (node {node.name})", where,
                             "express the selection with views of the tensor itself (slicing with a step, unfold, "
                             "narrow, reshape), or call .contiguous() before as_strided and read only its elements",
                             f"it {why}: the sharded program holds the values of the input, not the memory the "
                             "input is a view of")
        lo = offset + sum(min(0, (n - 1) * st) for n, st in zip(size, stride))
        hi = offset + sum(max(0, (n - 1) * st) for n, st in zip(size, stride))
        fake_mode = getattr(val, "fake_mode", None)
        if xv.is_contiguous():
            if lo < x_offset or hi >= x_offset + xv.numel():
                refuse("reads storage outside the elements of its (contiguous) input")
            with gm.graph.inserting_before(node):
                copy = gm.graph.call_function(aten.clone.default, (x,), {"memory_format": torch.contiguous_format})
                copy.meta = {**_meta_like(node), "val": xv.clone(memory_format=torch.contiguous_format)
                             if fake_mode is None else _in_mode(fake_mode, lambda: xv.clone(
                                 memory_format=torch.contiguous_format))}
                new = gm.graph.call_function(aten.as_strided.default, (copy, list(size), list(stride),
                                                                        offset - x_offset))
                new.meta = _meta_like(node)
        else:
            if xv.numel() > _AS_STRIDED_CHECK_MAX or val.numel() > _AS_STRIDED_CHECK_MAX:
                refuse(f"reads a non-contiguous input of {xv.numel()} elements (too many to check which "
                       "elements it reads)")
            held = _positions(xv.shape, xv.stride(), x_offset)
            read = _positions(size, stride, offset)
            if not bool(torch.isin(read, held).all()):
                refuse("reads storage outside the elements of its (non-contiguous) input")
            length = int(held.max()) + 1
            with gm.graph.inserting_before(node):
                zeros = gm.graph.call_function(aten.new_zeros.default, (x, [length]))
                scattered = gm.graph.call_function(aten.as_strided_scatter.default,
                                                   (zeros, x, list(xv.shape), list(xv.stride()), x_offset))
                new = gm.graph.call_function(aten.as_strided.default, (scattered, list(size), list(stride), offset))
                new.meta = _meta_like(node)
                flat = _in_mode(fake_mode, lambda: xv.new_zeros([length])) if fake_mode else xv.new_zeros([length])
                zeros.meta = {**_meta_like(node), "val": flat}
                scattered.meta = {**_meta_like(node), "val": flat}
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        count += 1
    if count:
        notes.append(f"made {count} as_strided op(s) read their input's values, not its storage (clone, or a "
                     "scatter at the traced storage positions, first)")


def _in_mode(fake_mode, fn):
    with fake_mode:
        return fn()


def _positions(size, stride, offset) -> torch.Tensor:
    """Storage positions of every element of a strided view, flat (int64)."""
    pos = torch.full((), offset, dtype=torch.int64)
    for n, st in zip(size, stride):
        pos = pos.unsqueeze(-1) + torch.arange(n, dtype=torch.int64) * st
    return pos.reshape(-1)


def _out_free_overload(schema):
    """The overload of the same aten packet whose arguments are `schema`'s without the `out` one (div.out ->
    div.Tensor), or None."""
    packet = getattr(torch.ops.aten, schema.name.split("::")[-1], None)
    if packet is None:
        return None
    wanted = [(a.name, str(a.type)) for a in schema.arguments
              if not (a.kwarg_only and a.alias_info is not None and a.alias_info.is_write)]
    for overload_name in packet.overloads():
        overload = getattr(packet, overload_name)
        args = overload._schema.arguments
        if any(a.alias_info is not None and a.alias_info.is_write for a in args):
            continue
        if [(a.name, str(a.type)) for a in args] == wanted:
            return overload
    return None


def _drop_asserts(gm: torch.fx.GraphModule, notes: list[str]) -> None:
    """Drop export's assertion nodes, and with them the condition each one alone read: a data-dependent
    `assert lengths.max().item() <= slen` (XLM, Flaubert) leaves `max -> item -> operator.le` with no user
    once its `_assert_scalar` is gone, and a SymInt/SymBool computed from tensor data is no value the
    planner can price or shard (it raised a bare StopIteration there). Only nodes that write nothing are
    removed, and only when nothing else reads them."""
    dropped, dead = 0, 0
    todo: list[torch.fx.Node] = []
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target in _ASSERT_OPS and not node.users:
            todo.extend(a for a in node.all_input_nodes)
            gm.graph.erase_node(node)
            dropped += 1
    erased: set[torch.fx.Node] = set()
    while todo:
        node = todo.pop()
        if (node in erased or node.users or node.op != "call_function" or mutated_args(node)
                or draws_random(node) or node.target in _ASSERT_OPS):
            continue
        inputs = list(node.all_input_nodes)
        gm.graph.erase_node(node)
        erased.add(node)
        dead += 1
        todo.extend(inputs)
    if dropped:
        notes.append(f"dropped {dropped} shape-assertion node(s)"
                     + (f" and {dead} node(s) computing only their conditions" if dead else ""))


def _drop_cache_leftovers(gm: torch.fx.GraphModule, notes: list[str]) -> None:
    """Normalisation 8 of the module docstring."""
    cats, dead = drop_empty_cat_operands(gm), drop_dead_code(gm)
    if cats or dead:
        notes.append(f"removed empty operands of {cats} cat(s) and {dead} node(s) whose values reach no output "
                     "and that write nothing read (e.g. what building a key/value cache adds)")


def _device_free(gm: torch.fx.GraphModule, notes: list[str], constants: dict[str, torch.Tensor]) -> None:
    """Normalisation 3 of the module docstring (`tracer/device_free.py`; the renaming runs last, in trace)."""
    views_as_reshapes(gm)  # canonical spellings, not noted
    wrapped_scalars(gm, constants)
    dropped, removed = drop_contiguous(gm), uncopied_constants(gm)
    if dropped:
        notes.append(f"dropped {dropped} aten.contiguous node(s) (memory layout only)")
    if removed:
        notes.append(f"removed {removed} lift_fresh_copy / detach_ node(s) on constants created in forward "
                     "(recorded on some devices only; nothing writes through them)")


ALIASES = {
    "absolute": "abs", "arccos": "acos", "arccosh": "acosh", "arcsin": "asin", "arcsinh": "asinh", "arctan": "atan",
    "arctan2": "atan2", "arctanh": "atanh", "clip": "clamp", "concat": "cat", "concatenate": "cat", "divide": "div",
    "true_divide": "div", "fix": "trunc", "greater": "gt", "greater_equal": "ge", "less": "lt", "less_equal": "le",
    "multiply": "mul", "negative": "neg", "not_equal": "ne", "subtract": "sub", "swapaxes": "transpose",
    "swapdims": "transpose", "moveaxis": "movedim", "special_expit": "sigmoid", "special_exp2": "exp2",
    "special_expm1": "expm1", "special_log1p": "log1p", "special_round": "round", "special_sinc": "sinc",
    "special_logit": "logit", "special_psi": "digamma", "special_digamma": "digamma", "special_erf": "erf",
    "special_erfc": "erfc", "special_erfinv": "erfinv", "special_gammaln": "lgamma", "special_polygamma": "polygamma",
    "special_multigammaln": "mvlgamma", "special_log_softmax": "log_softmax", "special_softmax": "softmax",
    "special_i0": "i0", "special_xlogy": "xlogy"}
"""torch's documented aliases (`torch.clip` is `torch.clamp`, ...) that torch.export keeps under their own names:
alias -> the op with a sharding rule. In-place forms (`clip_`) map alike; an overload is renamed only where the
target has the same overload with the same arguments."""


def _alias_target(node: torch.fx.Node):
    """The canonical overload of the aliased ATen overload `node` calls (`ALIASES`), or None: the same argument
    types (and names, where the node passes keywords: `swapaxes(axis0, axis1)` is `transpose(dim0, dim1)`)."""
    target = node.target
    packet = getattr(target, "overloadpacket", None)
    name = getattr(packet, "__name__", "")
    base, inplace = (name[:-1], "_") if name.endswith("_") and not name.endswith("__") else (name, "")
    canonical = ALIASES.get(base)
    if canonical is None:
        return None
    packet = getattr(torch.ops.aten, canonical + inplace, None)
    if packet is None:
        return None
    keys = (lambda a: (a.name, str(a.type))) if node.kwargs else (lambda a: str(a.type))
    wanted = [keys(a) for a in target._schema.arguments]
    names = [target._overloadname] + [o for o in packet.overloads() if o != target._overloadname]
    for overload in (getattr(packet, o, None) for o in names):  # the same overload name first (swapaxes.default
        if overload is not None and [keys(a) for a in overload._schema.arguments] == wanted:  # is transpose.int)
            return overload
    return None


def _movedim_order(node: torch.fx.Node) -> list[int]:
    """The permutation `movedim(x, source, destination)` applies (x's traced rank)."""
    nd = node.args[0].meta["val"].dim()
    src, dst = (list(a) if isinstance(a, (list, tuple)) else [a] for a in node.args[1:3])
    src, dst = [d % nd for d in src], [d % nd for d in dst]
    rest = iter(d for d in range(nd) if d not in src)
    placed = dict(zip(dst, src))
    return [placed[i] if i in placed else next(rest) for i in range(nd)]


def _twins(gm: torch.fx.GraphModule, notes: list[str]) -> None:
    """Normalisation 9 (module docstring): ops reading only the shape or dtype of their second operand, and aliases
    (`ALIASES`: cat's, clamp's, mul's, ...), become the ops with rules (reshape, to(dtype), the aliased op)."""
    aten = torch.ops.aten
    renamed: dict[str, int] = {}
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        name = str(getattr(node.target, "overloadpacket", node.target)).replace("aten.", "")
        if (canonical := _alias_target(node)) is not None:
            node.target = canonical
            if canonical in (aten.movedim.int, aten.movedim.intlist):  # movedim has no rule: a permute
                node.target, node.args = aten.permute.default, (node.args[0], _movedim_order(node))
        elif node.target in (aten.movedim.int, aten.movedim.intlist) and not node.kwargs:
            node.target, node.args = aten.permute.default, (node.args[0], _movedim_order(node))
        elif node.target in (aten.reshape_as.default, aten.view_as.default) and not node.kwargs:
            node.target, node.args = aten.reshape.default, (node.args[0], list(node.args[1].meta["val"].shape))
        elif node.target is aten.type_as.default and not node.kwargs and _type_as_keeps_device(node):
            node.target, node.args = aten.to.dtype, (node.args[0], node.args[1].meta["val"].dtype)
        else:
            continue
        renamed[name] = renamed.get(name, 0) + 1
    if renamed:
        notes.append(f"{sum(renamed.values())} node(s) written as the ops they alias or read only the shape / dtype of "
                     f"another operand ({', '.join(f'{k} x{v}' for k, v in sorted(renamed.items()))}; same values; "
                     "those ops have sharding rules)")


def _type_as_keeps_device(node: torch.fx.Node) -> bool:
    """Whether `type_as(x, other)` is `to(x, other's dtype)` on every device: x on other's device, or x a lifted
    constant or buffer (a placeholder: the sharded program keeps it on the module's device, like a buffer), or
    0-dim (ops take a 0-dim CPU tensor beside tensors of any device). DeBERTa-v2's `torch.tensor(mid - 1)
    .type_as(relative_pos)` traced on meta is a CPU constant `type_as` a meta tensor: it stayed `type_as` there
    and became `to` on CPU, so the CLI's plan did not fit the CPU model."""
    x, other = (a.meta["val"] for a in node.args[:2])
    return x.device == other.device or node.args[0].op == "placeholder" or x.dim() == 0


def _sequence_first_rnns(gm: torch.fx.GraphModule, notes: list[str]) -> None:
    """Normalisation 10 (module docstring): rnn(x, ..., batch_first=True) -> transpose(rnn(transpose(x), ...,
    batch_first=False)[0]); the states (outputs 1, 2) are laid out alike in both forms."""
    aten = torch.ops.aten
    rewritten = 0
    for node in list(gm.graph.nodes):
        if (node.op != "call_function" or node.kwargs or len(node.args) != 9 or node.args[8] is not True
                or node.target not in (aten.lstm.input, aten.gru.input, aten.rnn_tanh.input, aten.rnn_relu.input)):
            continue
        x, val = node.args[0], node.meta["val"]
        with gm.graph.inserting_before(node):
            xt = gm.graph.call_function(aten.transpose.int, (x, 0, 1))
            xt.meta = {**_meta_like(node), "val": _in_mode(val[0].fake_mode, lambda: x.meta["val"].transpose(0, 1))}
        node.args = (xt, *node.args[1:8], False)
        node.meta["val"] = (_in_mode(val[0].fake_mode, lambda: val[0].transpose(0, 1)), *val[1:])
        for user in list(node.users):
            if user.target is not operator.getitem or user.args[1] != 0:
                continue
            original = user.meta["val"]
            user.meta["val"] = node.meta["val"][0]
            with gm.graph.inserting_after(user):
                back = gm.graph.call_function(aten.transpose.int, (user, 0, 1))
                back.meta = {**_meta_like(user), "val": original}
            user.replace_all_uses_with(back, delete_user_cb=lambda u: u is not back)
        rewritten += 1
    if rewritten:
        notes.append(f"{rewritten} batch-first recurrent layer(s) written as the sequence-first op between transposes")


SPLIT_BIAS = "split_bias"  # node.meta key of the add a bias was split into (`_split_biases`)


def _row_wise(node: torch.fx.Node, prev: torch.fx.Node) -> bool:
    """Whether `node` computes each row of `prev` (a 2-D (rows, K) value, its first argument) on its own, so that
    it computes the same on the (L, N, K) form: linear by a weight (no bias: split off, 4), add / mul of a
    Python number or of a 1-D tensor along the last dim, or a unary pointwise op."""
    aten = torch.ops.aten
    if node.op != "call_function" or not node.args or node.args[0] is not prev or node.kwargs:
        return False
    rest = node.args[1:]
    if node.target is aten.linear.default:
        return len(rest) == 1 and isinstance(rest[0], torch.fx.Node) and prev not in rest
    if node.target in (aten.add.Tensor, aten.mul.Tensor, aten.sub.Tensor):
        other = rest[0] if len(rest) == 1 else None
        val = other.meta.get("val") if isinstance(other, torch.fx.Node) else None
        return isinstance(other, (int, float)) or (isinstance(val, torch.Tensor) and val.dim() == 1 and other is not prev)
    return torch.Tag.pointwise in getattr(node.target, "tags", ()) and not any(
        isinstance(a, torch.fx.Node) for a in rest)


def _unflattened_rows(gm: torch.fx.GraphModule, notes: list[str]) -> None:
    """Normalisation 12 (module docstring)."""
    aten = torch.ops.aten
    rewritten = 0
    for first in list(gm.graph.nodes):
        if first.op != "call_function" or first.target is not aten.reshape.default or first.kwargs:
            continue
        x = first.args[0]
        xv, fv = x.meta.get("val") if isinstance(x, torch.fx.Node) else None, first.meta.get("val")
        if not isinstance(xv, torch.Tensor) or not isinstance(fv, torch.Tensor) or xv.dim() < 2 or fv.dim() != 2:
            continue
        chain, value = [], first
        while len(value.users) == 1:
            (user,) = value.users
            if not _row_wise(user, value):
                break
            chain.append(user)
            value = user
        last = next(iter(value.users)) if len(value.users) == 1 else None
        lv = last.meta.get("val") if last is not None else None
        if (not chain or last is None or last.target is not aten.reshape.default or last.kwargs
                or not isinstance(lv, torch.Tensor) or lv.dim() != 3):
            continue
        lead = tuple(lv.shape[:2])  # (L, N): x keeps L as its dim 0 ((L, N, H, D), or (L, N*H, D) of need_weights)
        if (1 in lead or fv.shape[0] != lead[0] * lead[1] or xv.shape[0] != lead[0]
                or lv.shape[2] != value.meta["val"].shape[-1]):
            continue
        fake = fv.fake_mode if hasattr(fv, "fake_mode") else None
        first.args = (x, [*lead, fv.shape[1]])
        for node in (first, *chain):  # the same ops on the (L, N, K) values
            args = torch.fx.node.map_arg(node.args, lambda a: a.meta["val"])
            node.meta["val"] = _in_mode(fake, lambda: node.target(*args)) if fake is not None else node.target(*args)
        last.replace_all_uses_with(value)
        gm.graph.erase_node(last)
        rewritten += 1
    if rewritten:
        notes.append(f"{rewritten} flatten of rows around row-wise ops (reshape to (L*N, E), linear, reshape back) "
                     "kept as (L, N, E)")


def _split_biases(gm: torch.fx.GraphModule, notes: list[str]) -> None:
    aten = torch.ops.aten
    split = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is aten.linear.default and len(node.args) > 2 and node.args[2] is not None:
            x, weight, bias = node.args
            matmul = (aten.linear.default, (x, weight))
        elif node.target is aten.addmm.default and not node.kwargs:
            bias, x, weight = node.args
            matmul = (aten.mm.default, (x, weight))
        else:
            continue
        with gm.graph.inserting_before(node):
            product = gm.graph.call_function(*matmul)
            product.meta = _meta_like(node)
            total = gm.graph.call_function(aten.add.Tensor, (product, bias))
            total.meta = _meta_like(node)
            total.meta[SPLIT_BIAS] = True  # the rewriter adds the bias in the product's dtype (`rewriter.apply`)
        node.replace_all_uses_with(total)
        gm.graph.erase_node(node)
        split += 1
    if split:
        notes.append(f"split the bias off {split} linear layer(s) (linear/addmm -> matmul + add)")
