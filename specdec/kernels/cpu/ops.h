// The kernels as C++ functions, for forward.cpp to call without the dispatcher (see each .cpp for the meaning;
// the torch ops of the same names in TORCH_LIBRARY specdec_cpu are these).
#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace specdec {
namespace ops {

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const at::Tensor& block_tables, const at::Tensor& prefix_lens,
                           const at::Tensor& query_start_loc, const c10::optional<at::Tensor>& tree_mask,
                           double scale);
std::vector<at::Tensor> rms_norm(at::Tensor x, const at::Tensor& weight, double eps, int64_t mode,
                                 const c10::optional<at::Tensor>& residual,
                                 const c10::optional<at::Tensor>& residual_scale);
std::vector<at::Tensor> silu_mul(const at::Tensor& gate_up, const c10::optional<at::Tensor>& scale, int64_t mode);
std::vector<at::Tensor> quantize(const at::Tensor& x, int64_t mode);
at::Tensor rope_kv(const at::Tensor& qkv, const c10::optional<at::Tensor>& scale, const c10::optional<at::Tensor>& bias,
                   const at::Tensor& positions, const at::Tensor& cos, const at::Tensor& sin, at::Tensor k_cache,
                   at::Tensor v_cache, const at::Tensor& slot_mapping, int64_t q_heads, int64_t kv_heads);
at::Tensor linear_q8(const at::Tensor& q, const at::Tensor& s, const at::Tensor& w, const at::Tensor& w_scale,
                     const c10::optional<at::Tensor>& bias, int64_t weight_bits = 8,
                     const c10::optional<at::Tensor>& w_blocks = c10::nullopt);
at::Tensor linear_q4(const at::Tensor& q, const at::Tensor& s, const at::Tensor& gsum, const at::Tensor& w,
                     const at::Tensor& d, const at::Tensor& m_t, const c10::optional<at::Tensor>& bias);

}  // namespace ops
}  // namespace specdec
