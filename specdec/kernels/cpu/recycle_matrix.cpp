// Token Recycling's adjacency matrix (specdec/drafters/recycle_matrix.py) written and expanded in one call.
//
// Why C++: a batch-1 step of the default model writes 3 rows and expands a 3-node template. That is a few
// dozen numbers, but numpy spends 30-40 calls on it (hashing pair keys, the last-writer-wins dedupe, per-level
// gathers, pruning and renumbering): about 0.35 ms a step, 2.5% of an int8 decode step on an AVX2 core, which
// kept recycle's drafting above the 5% of a step that makes every accepted token profit. Here each is one pass.
//
// The arrays are the numpy ones of AdjacencyMatrix, shared (torch.from_numpy), written in place:
//   table [V, k] int32 and probs [V, k] float32: the single-token rows (-1 = unseen);
//   pair_keys [H] int64 (prev * V + token, -1 = empty), pair_table [H, k] int32, pair_probs [H, k] float32,
//   H = 2^pair_bits hashed slots (Fibonacci hashing, as AdjacencyMatrix._slots); pair_bits 0 = no pair rows.
// The numpy methods are the reference (tests/drafters/test_recycle_matrix.py holds these against them).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstdint>
#include <queue>
#include <vector>

namespace specdec {
namespace {

constexpr int32_t kUnseen = -1;

struct Matrix {
  int32_t* table;
  float* probs;
  int64_t* pair_keys;
  int32_t* pair_table;
  float* pair_probs;
  int64_t v, k, bits;

  Matrix(const at::Tensor& table_, const at::Tensor& probs_, const at::Tensor& pair_keys_,
         const at::Tensor& pair_table_, const at::Tensor& pair_probs_, int64_t pair_bits)
      : v(table_.size(0)), k(table_.size(1)), bits(pair_bits) {
    TORCH_CHECK(table_.dim() == 2 && table_.scalar_type() == at::kInt && table_.is_contiguous(),
                "table must be [V, k] int32, contiguous");
    TORCH_CHECK(probs_.scalar_type() == at::kFloat && probs_.is_contiguous() && probs_.sizes() == table_.sizes(),
                "probs must be [V, k] float32 like table");
    TORCH_CHECK(pair_bits >= 0 && pair_bits <= 24, "pair_bits must be in 0 .. 24");
    const int64_t slots = pair_bits ? int64_t{1} << pair_bits : 0;
    TORCH_CHECK(pair_keys_.scalar_type() == at::kLong && pair_keys_.is_contiguous() && pair_keys_.numel() == slots,
                "pair_keys must be [2^pair_bits] int64");
    TORCH_CHECK(pair_table_.scalar_type() == at::kInt && pair_table_.is_contiguous() &&
                    pair_table_.numel() == slots * k, "pair_table must be [2^pair_bits, k] int32");
    TORCH_CHECK(pair_probs_.scalar_type() == at::kFloat && pair_probs_.is_contiguous() &&
                    pair_probs_.numel() == slots * k, "pair_probs must be [2^pair_bits, k] float32");
    table = table_.data_ptr<int32_t>();
    probs = probs_.data_ptr<float>();
    pair_keys = pair_keys_.data_ptr<int64_t>();
    pair_table = pair_table_.data_ptr<int32_t>();
    pair_probs = pair_probs_.data_ptr<float>();
  }

  int64_t slot(int64_t key) const {  // as AdjacencyMatrix._slots: the top bits of key * 2^64 / phi
    return static_cast<int64_t>((static_cast<uint64_t>(key) * 0x9E3779B97F4A7C15ull) >> (64 - bits));
  }

  // The row that follows `token` after `prev`: its pair row where one is stored, else its single row.
  void row(int64_t prev, int64_t token, const int32_t** succ, const float** p) const {
    if (bits && prev >= 0) {
      const int64_t key = prev * v + token, s = slot(key);
      if (pair_keys[s] == key) {
        *succ = pair_table + s * k;
        *p = pair_probs + s * k;
        return;
      }
    }
    *succ = table + token * k;
    *p = probs + token * k;
  }
};

// What an expansion returns for b roots: tokens, parents (-1 past counts[b]), scores (0 past it), all [b, count].
struct Trees {
  at::Tensor tokens, parents, scores, counts;
  int64_t *ot, *op, *oc;  // their data
  float* os;
  Trees(int64_t b, int64_t count, const at::TensorOptions& opts)
      : tokens(at::full({b, count}, -1, opts)),
        parents(at::full({b, count}, -1, opts)),
        scores(at::zeros({b, count}, opts.dtype(at::kFloat))),
        counts(at::empty({b}, opts)),
        ot(tokens.data_ptr<int64_t>()),
        op(parents.data_ptr<int64_t>()),
        oc(counts.data_ptr<int64_t>()),
        os(scores.data_ptr<float>()) {}
};

void check_tokens(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() == 1 && t.scalar_type() == at::kLong && t.is_contiguous(), name, " must be [N] int64");
}

// Row tokens[i] := row rows[i] of succ (top-k ids, as top_k_probs gives them) and succ_probs, for i in order
// (a later write of the same row wins), and where prev[i] >= 0 the pair row (prev[i], tokens[i]) likewise (a
// later pair on the same slot wins). `rows` lets the caller put the accepted path last without a gather.
void recycle_write(at::Tensor table, at::Tensor probs, at::Tensor pair_keys, at::Tensor pair_table,
                   at::Tensor pair_probs, int64_t pair_bits, const at::Tensor& tokens, const at::Tensor& prev,
                   const at::Tensor& rows, const at::Tensor& succ, const at::Tensor& succ_probs) {
  const Matrix m(table, probs, pair_keys, pair_table, pair_probs, pair_bits);
  check_tokens(tokens, "tokens");
  check_tokens(prev, "prev");
  check_tokens(rows, "rows");
  const int64_t n = tokens.numel();
  TORCH_CHECK(prev.numel() == n && rows.numel() == n, "prev and rows must have one entry per token");
  TORCH_CHECK(succ.scalar_type() == at::kLong && succ.is_contiguous() && succ.dim() == 2 && succ.size(1) == m.k,
              "succ must be [R, k] int64");
  TORCH_CHECK(succ_probs.scalar_type() == at::kFloat && succ_probs.is_contiguous() &&
                  succ_probs.sizes() == succ.sizes(), "succ_probs must be [R, k] float32");
  const int64_t* tp = tokens.data_ptr<int64_t>();
  const int64_t* pp = prev.data_ptr<int64_t>();
  const int64_t* rp = rows.data_ptr<int64_t>();
  const int64_t* sp = succ.data_ptr<int64_t>();
  const float* qp = succ_probs.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(tp[i] >= 0 && tp[i] < m.v, "token id out of range");
    TORCH_CHECK(rp[i] >= 0 && rp[i] < succ.size(0), "row index out of range");
  }
  auto put = [&](int32_t* to, float* to_p, int64_t r) {
    for (int64_t j = 0; j < m.k; ++j) to[j] = static_cast<int32_t>(sp[r * m.k + j]);
    std::copy(qp + r * m.k, qp + (r + 1) * m.k, to_p);
  };
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = tp[i];
    put(m.table + t * m.k, m.probs + t * m.k, rp[i]);
    if (!m.bits || pp[i] < 0) continue;
    const int64_t key = pp[i] * m.v + t, s = m.slot(key);
    m.pair_keys[s] = key;
    put(m.pair_table + s * m.k, m.pair_probs + s * m.k, rp[i]);
  }
}

// A static template (nodes 0 .. count-1: parents before children, node 0 the root, node n rank ranks[n] of its
// parent's row) filled from each root; nodes on unseen entries, or under them, or of a rank >= k, are dropped
// and the rest renumbered in order. Returns tokens, parents (-1 for the root), scores (each node's stored
// probability in its parent's row; 0 for the root), all [B, count] with -1 / 0 past counts[b], and counts [B].
std::vector<at::Tensor> recycle_expand(const at::Tensor& table, const at::Tensor& probs, const at::Tensor& pair_keys,
                                       const at::Tensor& pair_table, const at::Tensor& pair_probs, int64_t pair_bits,
                                       const at::Tensor& roots, const at::Tensor& prevs, const at::Tensor& parents,
                                       const at::Tensor& ranks, int64_t count) {
  const Matrix m(table, probs, pair_keys, pair_table, pair_probs, pair_bits);
  check_tokens(roots, "roots");
  check_tokens(prevs, "prevs");
  check_tokens(parents, "parents");
  check_tokens(ranks, "ranks");
  const int64_t b = roots.numel();
  TORCH_CHECK(prevs.numel() == b, "prevs must have one entry per root");
  TORCH_CHECK(count >= 1 && count <= parents.numel() && ranks.numel() == parents.numel(),
              "count must be in 1 .. template nodes, ranks one per node");
  const int64_t* par = parents.data_ptr<int64_t>();
  const int64_t* rk = ranks.data_ptr<int64_t>();
  for (int64_t n = 1; n < count; ++n) TORCH_CHECK(par[n] >= 0 && par[n] < n, "parents must come before children");
  Trees out(b, count, roots.options());
  int64_t *ot = out.ot, *op = out.op, *oc = out.oc;
  float* os = out.os;
  const int64_t* rp = roots.data_ptr<int64_t>();
  const int64_t* vp = prevs.data_ptr<int64_t>();
  std::vector<int64_t> tok(count), before(count), index(count);
  std::vector<float> score(count);
  for (int64_t s = 0; s < b; ++s) {
    TORCH_CHECK(rp[s] >= 0 && rp[s] < m.v, "root token out of range");
    tok[0] = rp[s];
    before[0] = vp[s];
    for (int64_t n = 1; n < count; ++n) {
      const int64_t up = par[n];
      tok[n] = kUnseen;
      score[n] = 0.0f;
      before[n] = tok[up];
      if (tok[up] < 0 || rk[n] >= m.k) continue;
      const int32_t* succ;
      const float* p;
      m.row(before[up], tok[up], &succ, &p);
      tok[n] = succ[rk[n]];
      score[n] = p[rk[n]];
    }
    int64_t kept = 0;
    for (int64_t n = 0; n < count; ++n) {
      if (tok[n] < 0) continue;
      index[n] = kept;
      ot[s * count + kept] = tok[n];
      op[s * count + kept] = n ? index[par[n]] : -1;
      os[s * count + kept] = n ? score[n] : 0.0f;
      ++kept;
    }
    oc[s] = kept;
  }
  return {out.tokens, out.parents, out.scores, out.counts};
}

// The best-first tree of each root (AdjacencyMatrix.expand_best_first, its reference): the `budget` nodes of
// highest path probability (products in double, as the reference's Python floats), at most `width` ranks a
// node, none whose path falls below `min_prob`, no node deeper than `max_depth`; equal paths go in the order
// they were offered. Returns tokens, parents, scores (each node's stored probability; 0 for the root), all
// [B, budget + 1] with -1 / 0 past counts[b], and counts [B]. Why: grown in Python, a 6-node tree of the default
// model's hybrid cost 0.24 ms a step, 1.6% of an AMX decode step, in numpy lookups of one row at a time.
std::vector<at::Tensor> recycle_best_first(const at::Tensor& table, const at::Tensor& probs,
                                           const at::Tensor& pair_keys, const at::Tensor& pair_table,
                                           const at::Tensor& pair_probs, int64_t pair_bits, const at::Tensor& roots,
                                           const at::Tensor& prevs, int64_t budget, int64_t max_depth,
                                           double min_prob, int64_t width) {
  const Matrix m(table, probs, pair_keys, pair_table, pair_probs, pair_bits);
  check_tokens(roots, "roots");
  check_tokens(prevs, "prevs");
  const int64_t b = roots.numel();
  TORCH_CHECK(prevs.numel() == b, "prevs must have one entry per root");
  TORCH_CHECK(budget >= 0 && max_depth >= 0 && width >= 1, "budget and max_depth must be >= 0, width >= 1");
  width = std::min(width, m.k);
  const int64_t count = budget + 1;
  Trees out(b, count, roots.options());
  int64_t *ot = out.ot, *op = out.op, *oc = out.oc;
  float* os = out.os;
  const int64_t* rp = roots.data_ptr<int64_t>();
  const int64_t* vp = prevs.data_ptr<int64_t>();
  struct Offer {
    double path;
    int64_t order, token, parent;
    float p;
  };
  // The heap's top is the highest path, the earliest offer among equals (heapq on (-path, order)).
  auto later = [](const Offer& a, const Offer& c) { return a.path != c.path ? a.path < c.path : a.order > c.order; };
  std::vector<int64_t> depth(count);
  for (int64_t s = 0; s < b; ++s) {
    TORCH_CHECK(rp[s] >= 0 && rp[s] < m.v, "root token out of range");
    int64_t* tok = ot + s * count;
    int64_t* par = op + s * count;
    float* sc = os + s * count;
    std::priority_queue<Offer, std::vector<Offer>, decltype(later)> heap(later);
    int64_t order = 0, n = 1;
    tok[0] = rp[s];
    depth[0] = 0;
    auto offer = [&](int64_t node, double path) {
      const int32_t* succ;
      const float* p;
      m.row(node ? tok[par[node]] : vp[s], tok[node], &succ, &p);
      for (int64_t j = 0; j < width; ++j) {
        const double q = static_cast<double>(p[j]);
        if (succ[j] < 0 || q <= 0.0 || path * q < min_prob) break;  // ranks are best first
        heap.push(Offer{path * q, order++, succ[j], node, p[j]});
      }
    };
    offer(0, 1.0);
    while (!heap.empty() && n - 1 < budget) {
      const Offer best = heap.top();
      heap.pop();
      tok[n] = best.token;
      par[n] = best.parent;
      sc[n] = best.p;
      depth[n] = depth[best.parent] + 1;
      ++n;
      if (depth[n - 1] < max_depth) offer(n - 1, best.path);
    }
    oc[s] = n;
  }
  return {out.tokens, out.parents, out.scores, out.counts};
}

}  // namespace
}  // namespace specdec

TORCH_LIBRARY_FRAGMENT(specdec_cpu, m) {
  m.def("recycle_write(Tensor(a!) table, Tensor(b!) probs, Tensor(c!) pair_keys, Tensor(d!) pair_table, "
        "Tensor(e!) pair_probs, int pair_bits, Tensor tokens, Tensor prev, Tensor rows, Tensor succ, "
        "Tensor succ_probs) -> ()");
  m.impl("recycle_write", c10::DispatchKey::CPU, &specdec::recycle_write);
  m.def("recycle_expand(Tensor table, Tensor probs, Tensor pair_keys, Tensor pair_table, Tensor pair_probs, "
        "int pair_bits, Tensor roots, Tensor prevs, Tensor parents, Tensor ranks, int count) -> Tensor[]");
  m.impl("recycle_expand", c10::DispatchKey::CPU, &specdec::recycle_expand);
  m.def("recycle_best_first(Tensor table, Tensor probs, Tensor pair_keys, Tensor pair_table, Tensor pair_probs, "
        "int pair_bits, Tensor roots, Tensor prevs, int budget, int max_depth, float min_prob, int width) "
        "-> Tensor[]");
  m.impl("recycle_best_first", c10::DispatchKey::CPU, &specdec::recycle_best_first);
}
