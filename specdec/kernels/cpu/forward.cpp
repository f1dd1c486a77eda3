// Every decoder layer of one forward pass in one call: the fast path's layer loop (specdec/models/fast_path.py)
// moved into C++, so a step pays one Python-to-C++ crossing instead of about ten per layer.
//
// Per layer, with each linear given by `kinds` (0 float32 weight [N, K]; 8 QLinear int8 tiles; 4 QLinear int4
// tiles) and each producer writing the form its linear takes:
//   rms_norm (+ the previous layer's down output) -> qkv -> rope_kv -> paged_attention -> [quantize] -> o
//   -> rms_norm (+ o) -> gate_up -> silu_mul -> down
// then the final norm. The functions are the same as the ops of the same names (ops.h), so this pass gives
// exactly the bits the step-by-step fast path gives.
#include <ATen/ATen.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <chrono>

#include "ops.h"

namespace specdec {
namespace {

constexpr int64_t kSlots = 4;  // per linear in `params`: (a, b, c, bias)
constexpr int64_t kLinears = 4;  // qkv, o, gate_up, down
constexpr int64_t kPerLayer = 2 + kSlots * kLinears;  // + the two norm weights

struct Timer {
  double* totals;  // [linears, attention, elementwise] seconds, or null
  std::chrono::steady_clock::time_point start;
  void begin() {
    if (totals) start = std::chrono::steady_clock::now();
  }
  void end(int what) {
    if (totals) totals[what] += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
};

// The weights of a model's decoder layers in decode_layers' order, built once per model (passing hundreds of
// tensors on every call would cost more than the call): per layer the two norm weights, then (a, b, c, bias)
// for qkv, o, gate_up and down; `kinds` gives each linear's format.
struct LayerWeights : torch::CustomClassHolder {
  std::vector<at::Tensor> params;
  std::vector<int64_t> kinds;
  LayerWeights(const std::vector<c10::optional<at::Tensor>>& p, std::vector<int64_t> k) : kinds(std::move(k)) {
    TORCH_CHECK(p.size() % kPerLayer == 0 && kinds.size() * kPerLayer == p.size() * kLinears,
                kPerLayer, " params and ", kLinears, " kinds per layer");
    for (const auto& t : p) params.push_back(t.has_value() ? *t : at::Tensor());
  }
  int64_t num_layers() const { return static_cast<int64_t>(kinds.size()) / kLinears; }
};

const at::Tensor& get(const std::vector<at::Tensor>& params, int64_t i, at::Tensor& holder) {
  holder = params[i];
  return holder;
}

c10::optional<at::Tensor> maybe(const at::Tensor& t) {
  return t.defined() ? c10::optional<at::Tensor>(t) : c10::nullopt;
}

int64_t form(int64_t kind) { return kind == 0 ? 0 : 2; }  // float input, or q8 rows

at::Tensor linear(const std::vector<at::Tensor>& act, int64_t kind, const std::vector<at::Tensor>& params,
                  int64_t base) {
  at::Tensor a, b, c, bias;
  get(params, base, a);
  get(params, base + 1, b);
  get(params, base + 2, c);
  get(params, base + 3, bias);
  if (kind == 0) return at::linear(act[0], a, maybe(bias));
  if (kind == 8 || kind == 7) return ops::linear_q8(act[0], act[1], a, b, maybe(bias), kind, maybe(c));  // c: blocks
  TORCH_CHECK(kind == 4, "unknown linear kind ", kind);
  return ops::linear_q4(act[0], act[1], act[2], a, b, c, maybe(bias));
}

// Rows in the form a linear of `kind` takes: float as they are, else q8 (ops::quantize; the same as QLinear's own).
std::vector<at::Tensor> input_for(const at::Tensor& x, int64_t kind) {
  return kind == 0 ? std::vector<at::Tensor>{x.reshape({x.size(0), -1})} : ops::quantize(x, 2);
}

at::Tensor decode_layers(at::Tensor x, const at::Tensor& positions, const at::Tensor& slot_mapping,
                         const at::Tensor& block_tables, const at::Tensor& prefix_lens,
                         const at::Tensor& query_start_loc, const c10::optional<at::Tensor>& tree_mask,
                         const at::Tensor& cos, const at::Tensor& sin, at::TensorList k_caches,
                         at::TensorList v_caches, const c10::intrusive_ptr<LayerWeights>& weights,
                         const at::Tensor& final_norm, int64_t q_heads, int64_t kv_heads, double eps, double scale,
                         const c10::optional<at::Tensor>& timings) {
  const int64_t layers = static_cast<int64_t>(k_caches.size());
  TORCH_CHECK(static_cast<int64_t>(v_caches.size()) == layers && weights->num_layers() >= layers,
              "one cache pair per layer, and weights for each");
  const std::vector<at::Tensor>& params = weights->params;
  Timer timer{nullptr, {}};
  if (timings.has_value() && timings->defined()) {
    TORCH_CHECK(timings->scalar_type() == at::kDouble && timings->numel() == 3 && timings->is_contiguous(),
                "timings must be [3] float64");
    timer.totals = timings->data_ptr<double>();
  }
  at::Tensor pending, holder;
  for (int64_t l = 0; l < layers; ++l) {
    const int64_t p = l * kPerLayer;
    const int64_t* kind = weights->kinds.data() + l * kLinears;
    at::Tensor ln1, ln2;
    get(params, p, ln1);
    get(params, p + 1, ln2);
    timer.begin();
    std::vector<at::Tensor> act = ops::rms_norm(x, ln1, eps, form(kind[0]), maybe(pending), c10::nullopt);
    timer.end(2);
    timer.begin();
    at::Tensor qkv = linear(act, kind[0], params, p + 2);
    timer.end(0);
    timer.begin();
    at::Tensor q = ops::rope_kv(qkv, c10::nullopt, c10::nullopt, positions, cos, sin, k_caches[l], v_caches[l],
                                slot_mapping, q_heads, kv_heads);
    timer.end(2);
    timer.begin();
    at::Tensor out = ops::paged_attention(q, k_caches[l], v_caches[l], block_tables, prefix_lens, query_start_loc,
                                          tree_mask, scale);
    timer.end(1);
    timer.begin();
    act = input_for(out, kind[1]);
    timer.end(2);
    timer.begin();
    at::Tensor y = linear(act, kind[1], params, p + 2 + kSlots);
    timer.end(0);
    timer.begin();
    act = ops::rms_norm(x, ln2, eps, form(kind[2]), y, c10::nullopt);
    timer.end(2);
    timer.begin();
    at::Tensor gate_up = linear(act, kind[2], params, p + 2 + 2 * kSlots);
    timer.end(0);
    timer.begin();
    act = ops::silu_mul(gate_up, c10::nullopt, form(kind[3]));
    timer.end(2);
    timer.begin();
    pending = linear(act, kind[3], params, p + 2 + 3 * kSlots);
    timer.end(0);
  }
  timer.begin();
  at::Tensor hidden = ops::rms_norm(x, final_norm, eps, 0, maybe(pending), c10::nullopt)[0];
  timer.end(2);
  return hidden;
}

// The EAGLE-1/2 predictor's layer in one call: eagle_fast.py's kernel path, the same functions in the same order
// (so the same bits), without a Python-to-C++ crossing and a few tensors per op. Why: on the default model a
// drafted level spent more time around its kernels than in them (a py-spy profile with native frames put 3.2% of
// a step in the kernels and 8% in Python and torch's dispatch around them).
//   fc: the embeddings and the features each through their own linear (each with its own int8 scale), summed
//   -> qkv -> rope_kv (writes k, v) -> paged_attention -> o -> rms_norm (adds o into the residual first)
//   -> gate_up -> silu_mul -> down; returns residual + down.
// `weights` holds two entries of decode_layers' layout: [-, post-attention norm, qkv, o, gate_up, down] and
// [-, -, fc's embedding part, fc's feature part, -, -].
at::Tensor eagle_layer(const at::Tensor& embeds, const at::Tensor& features, const at::Tensor& positions,
                       const at::Tensor& slot_mapping, const at::Tensor& block_tables, const at::Tensor& prefix_lens,
                       const at::Tensor& query_start_loc, const c10::optional<at::Tensor>& tree_mask,
                       const at::Tensor& cos, const at::Tensor& sin, at::Tensor k_cache, at::Tensor v_cache,
                       const c10::intrusive_ptr<LayerWeights>& weights, int64_t q_heads, int64_t kv_heads, double eps,
                       double scale) {
  TORCH_CHECK(weights->num_layers() == 2, "eagle_layer takes the layer's entry and the fc entry");
  TORCH_CHECK(embeds.dim() == 2 && features.dim() == 2 && embeds.size(0) == features.size(0),
              "embeds and features must be [T, H] and [T, F]");
  const std::vector<at::Tensor>& params = weights->params;
  const int64_t* kind = weights->kinds.data();  // qkv, o, gate_up, down, fc embedding part, fc feature part
  const at::Tensor& post_norm = params[1];
  at::Tensor residual = linear(input_for(embeds.contiguous(), kind[4]), kind[4], params, kPerLayer + 2);
  residual = residual + linear(input_for(features.contiguous(), kind[5]), kind[5], params, kPerLayer + 2 + kSlots);
  at::Tensor qkv = linear(input_for(residual, kind[0]), kind[0], params, 2);
  at::Tensor q = ops::rope_kv(qkv, c10::nullopt, c10::nullopt, positions, cos, sin, k_cache, v_cache, slot_mapping,
                              q_heads, kv_heads);
  at::Tensor out = ops::paged_attention(q, k_cache, v_cache, block_tables, prefix_lens, query_start_loc, tree_mask,
                                        scale);
  at::Tensor y = linear(input_for(out, kind[1]), kind[1], params, 2 + kSlots);
  std::vector<at::Tensor> act = ops::rms_norm(residual, post_norm, eps, form(kind[2]), y, c10::nullopt);
  at::Tensor gate_up = linear(act, kind[2], params, 2 + 2 * kSlots);
  at::Tensor down = linear(ops::silu_mul(gate_up, c10::nullopt, form(kind[3])), kind[3], params, 2 + 3 * kSlots);
  return residual + down;
}

}  // namespace
}  // namespace specdec

TORCH_LIBRARY_FRAGMENT(specdec_cpu, m) {
  m.class_<specdec::LayerWeights>("LayerWeights")
      .def(torch::init<std::vector<c10::optional<at::Tensor>>, std::vector<int64_t>>())
      .def("num_layers", &specdec::LayerWeights::num_layers);
  m.def("decode_layers(Tensor(a!) x, Tensor positions, Tensor slot_mapping, Tensor block_tables, Tensor prefix_lens, "
        "Tensor query_start_loc, Tensor? tree_mask, Tensor cos, Tensor sin, Tensor(b!)[] k_caches, "
        "Tensor(c!)[] v_caches, __torch__.torch.classes.specdec_cpu.LayerWeights weights, Tensor final_norm, "
        "int q_heads, int kv_heads, float eps, float scale, Tensor(d!)? timings) -> Tensor");
  m.impl("decode_layers", c10::DispatchKey::CPU, &specdec::decode_layers);
  m.def("eagle_layer(Tensor embeds, Tensor features, Tensor positions, Tensor slot_mapping, Tensor block_tables, "
        "Tensor prefix_lens, Tensor query_start_loc, Tensor? tree_mask, Tensor cos, Tensor sin, Tensor(a!) k_cache, "
        "Tensor(b!) v_cache, __torch__.torch.classes.specdec_cpu.LayerWeights weights, int q_heads, int kv_heads, "
        "float eps, float scale) -> Tensor");
  m.impl("eagle_layer", c10::DispatchKey::CPU, &specdec::eagle_layer);
}
