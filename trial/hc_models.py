"""Trial 10c models: patterns behind silently wrong numbers reported publicly in other auto-parallel systems.
Each builder returns (model, example_inputs); seeded, module level (spawned ranks re-import)."""
import torch
from torch import nn
import torch.nn.functional as F

B, T, H = 4, 8, 32


def _x(*shape, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


class TransposedParam(nn.Module):
    """SkyRL#1886 class (a collective on a .contiguous() copy of a non-contiguous tensor): parameters whose
    storage is transposed (non-contiguous), so their gradients are non-contiguous too."""
    def __init__(self):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(H, 2 * H).t() * 0.2)     # (2H, H), strides (1, 2H)
        self.w2 = nn.Parameter(torch.randn(H, 2 * H) * 0.2)        # (H, 2H) contiguous
        self.b = nn.Parameter(torch.randn(2 * H, 3)[:, 0] * 0.1)   # a strided 1-D view as a parameter

    def forward(self, x):
        h = torch.relu(F.linear(x, self.w1, self.b))
        return F.linear(h, self.w2)


def transposed_param():
    torch.manual_seed(0)
    return TransposedParam(), (_x(B, T, H),)


class TransposedActivation(nn.Module):
    """SkyRL#1886 (the all-reduce of a transposed, non-contiguous gradient): (B,T,H) -> transpose(0,1) -> a
    column-parallel linear -> row-parallel linear -> transpose back."""
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(H, 2 * H), nn.Linear(2 * H, H), nn.Linear(H, H)

    def forward(self, x):
        h = self.c(x).transpose(0, 1)
        return self.b(F.gelu(self.a(h))).transpose(0, 1) * x


def transposed_activation():
    torch.manual_seed(0)
    return TransposedActivation(), (_x(B, T, H),)


class MultiQuery(nn.Module):
    """bigcode-project/Megatron-LM#11 (MQA key/value gradients not reduced over tp): 4 query heads, ONE shared
    key/value head (with biases), so k/v projections are replicated across tp ranks."""
    def __init__(self, heads=4, kv=1):
        super().__init__()
        self.h, self.kv, self.d = heads, kv, H // heads
        self.q = nn.Linear(H, H)
        self.k, self.v = nn.Linear(H, kv * self.d), nn.Linear(H, kv * self.d)
        self.o = nn.Linear(H, H)

    def forward(self, x):
        q = self.q(x).view(B, T, self.h, self.d).transpose(1, 2)
        k = self.k(x).view(B, T, self.kv, self.d).transpose(1, 2)
        v = self.v(x).view(B, T, self.kv, self.d).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o(a.transpose(1, 2).reshape(B, T, H))


def multi_query():
    torch.manual_seed(0)
    return MultiQuery(), (_x(B, T, H),)


class PartialReductions(nn.Module):
    """pytorch#165962 (max/min/norm computed on a Partial before its sum): amax, aminmax, logsumexp, vector
    norm (inf and 3) and a max-with-indices of a row-parallel linear's output."""
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, 2 * H), nn.Linear(2 * H, H)

    def forward(self, x):
        y = self.b(torch.relu(self.a(x)))
        mn, mx = torch.aminmax(y, dim=-1)
        v, i = y.max(dim=1)
        return (y.amax(-1) + mn * mx + torch.logsumexp(y, -1) + torch.linalg.vector_norm(y, float("inf"), -1)
                + torch.linalg.vector_norm(y, 3, -1)).sum() + v.sum() + i.float().sum() * 1e-3


def partial_reductions():
    torch.manual_seed(0)
    return PartialReductions(), (_x(B, T, H),)


class DoubleShardView(nn.Module):
    """pytorch#177972/#170914/#166598 (a dim sharded over two mesh axes, split/merged by a view, uneven):
    width 36 (9 x 4), a view (B,T,36)->(B,T,9,4)->(B,T*9,4)->(B,T,36) around non-linear ops, and a matmul whose
    contraction dim can be sharded over both axes."""
    W = 36

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, self.W), nn.Linear(self.W, H)
        self.m = nn.Parameter(torch.randn(self.W, self.W) * 0.1)

    def forward(self, x):
        h = self.a(x)
        g = h.view(B, T, 9, 4).softmax(-1).reshape(B, T * 9, 4).cumsum(1).reshape(B, T, self.W)
        return self.b(torch.tanh(g @ self.m) + h)


def double_shard_view():
    torch.manual_seed(0)
    return DoubleShardView(), (_x(B, T, H),)


class UnevenVocab(nn.Module):
    """NVIDIA/Megatron-LM#1754 (vocab not divisible by tp: divergent loss): vocab 101 on tp=4 (26,26,26,23),
    tied embedding, label smoothing and ignore_index together."""
    V = 101

    def __init__(self):
        super().__init__()
        self.e = nn.Embedding(self.V, H)
        self.l = nn.Linear(H, H)

    def forward(self, ids, labels):
        h = torch.tanh(self.l(self.e(ids)))
        logits = h @ self.e.weight.t()
        return F.cross_entropy(logits.reshape(-1, self.V), labels.reshape(-1), ignore_index=-100,
                               label_smoothing=0.1)


def uneven_vocab():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, UnevenVocab.V, (B, T), generator=g)
    labels = torch.randint(0, UnevenVocab.V, (B, T), generator=g)
    labels[0, :3] = -100
    return UnevenVocab(), (ids, labels)


class ShardedDimNorms(nn.Module):
    """pytorch#159856 / #172288 / #170035 (norms of a Partial or sharded value: a sum of local norms, a
    NormPartial summed): vector norms of a column-parallel output over its sharded last dim for p = 2, 3, inf,
    -inf, 0, 0.5, 1, then summed; F.normalize, torch.dist and a Frobenius matrix norm over (T, H)."""
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, 2 * H), nn.Linear(2 * H, H)

    def forward(self, x):
        y = self.a(x)
        out = 0
        for p in (2, 3, float("inf"), float("-inf"), 0, 0.5, 1):
            out = out + torch.linalg.vector_norm(y, p, dim=-1).sum() * 0.01
        z = self.b(F.normalize(y, dim=-1) * 3)
        return (out + torch.linalg.matrix_norm(y, "fro").sum() + torch.dist(y, y.flip(0), 3)
                + torch.linalg.vector_norm(z, 2, dim=(1, 2)).sum())


def sharded_dim_norms():
    torch.manual_seed(0)
    return ShardedDimNorms(), (_x(B, T, H),)


class CheckpointedTP(nn.Module):
    """NVIDIA/Megatron-LM#7452 finding 4 (recompute runs its collectives on the wrong group) and ColossalAI#5620
    (pipeline + gradient checkpointing): a user's torch.utils.checkpoint region holding a column -> row
    parallel pair and a LayerNorm, so the recomputation reruns tp collectives on a 2x2 mesh."""
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(H)
        self.a, self.b, self.c = nn.Linear(H, 2 * H), nn.Linear(2 * H, H), nn.Linear(H, H)

    def _inner(self, x):
        return x + self.b(F.gelu(self.a(self.ln(x))))

    def forward(self, x):
        h = torch.utils.checkpoint.checkpoint(self._inner, x, use_reentrant=False)
        return self.c(h)


def checkpointed_tp():
    torch.manual_seed(0)
    return CheckpointedTP(), (_x(B, T, H),)


class WeightUsedTwiceOnPath(nn.Module):
    """pytorch#180952 (a weight used at two sites on one path, its gradient double-counted by a split dW pass):
    x @ w @ w and a Linear applied to its own output."""
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(H, H) * 0.2)
        self.l = nn.Linear(H, H)

    def forward(self, x):
        return self.l(torch.tanh(self.l(x @ self.w @ self.w)))


def weight_used_twice_on_path():
    torch.manual_seed(0)
    return WeightUsedTwiceOnPath(), (_x(B, T, H),)
