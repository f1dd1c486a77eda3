// The bfloat16 attention kernels' shared arithmetic (attention_amx.cpp on AMX tiles, attention_bf16.cpp with
// AVX512-BF16 dot products): queries and weights rounded to bfloat16, each query's list weights and
// denominator, and values packed as interleaved pairs of list entries, the operand layout both tdpbf16ps and
// vdpbf16ps multiply. Not a header to include anywhere else: each kernel includes it inside its own anonymous
// namespace and AVX-512 BF16 target region, after vec16.h, with kT (16) and kStep (32) defined.

// Sixteen floats rounded to bfloat16 (round to nearest even), into dst.
inline void to_bf16(const float* src, uint16_t* dst) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src)));
}

// The lanes of a block of sixteen list entries that lie before the list's end (`left` entries from the block on).
inline __mmask16 live_lanes(int64_t left) {
  if (left <= 0) return 0;
  return left >= kT ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
}

// 2^t on the lanes in `live` (t <= 0 here: a score minus the list's largest), zero on the others and below 2^-126
// (no denormals: the tiles would read them as zero while the denominator counted them). A degree-4 polynomial
// on t's fraction, fitted for relative error (within 3e-6 of 2^t), scaled by 2^round(t): the weights are rounded
// to bfloat16 next, a relative step of 2^-8, so a correctly rounded exp would round to the same weights but for
// about one in a thousand, at three times this work (the exps of a tree's rows are the bulk of its softmax).
inline __m512 exp2_weights(__m512 t, __mmask16 live) {
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 q = _mm512_set1_ps(0.009570068679749966f);
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(0.055917806923389435f));
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(0.240247443318367f));
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(0.6931218504905701f));
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(0.9999992847442627f));
  live &= _mm512_cmp_ps_mask(t, _mm512_set1_ps(-126.0f), _CMP_GE_OQ);
  return _mm512_maskz_scalef_ps(live, q, n);
}

// The shared list of a block of rows, into `keys` (element offsets; sized to a multiple of kStep): the
// prefix, then the new keys up to the last one any of the rows sees (lists hold their new keys in node order):
// a block of 16 prompt rows early in a 600-token prefill sees a few dozen keys, not all 600, and scoring and
// packing the rest doubled a prefill's attention. `shared[r]`: row r's list is a prefix of it (its visible new
// keys are the first count[r]). Returns the list's length.
inline int64_t shared_list(const int64_t* prefix, int64_t p, const int64_t* new_keys, int64_t n_new,
                           const int64_t* visible, const int64_t* count, int64_t rows, std::vector<int64_t>& keys,
                           std::vector<char>& shared) {
  int64_t seen = 0;
  for (int64_t r = 0; r < rows; ++r)
    if (count[r] > 0) seen = std::max(seen, visible[r * n_new + count[r] - 1] + 1);
  const int64_t n = p + seen;
  keys.resize((n + kStep - 1) / kStep * kStep);
  std::copy(prefix, prefix + p, keys.begin());
  std::copy(new_keys, new_keys + seen, keys.begin() + p);
  shared.assign(rows, 1);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < count[r] && shared[r]; ++c) shared[r] = visible[r * n_new + c] == c;
  return n;
}

// A query's weights over its list: x[0 .. len) its scores (read up to the next multiple of 32), wq its weights
// in bfloat16 (written up to `width`, zeros past the list), returns the denominator. The scale enters with the
// change of base, one multiply-add: 2^(score * c - top * c) with c = scale * log2(e). Thirty-two entries a
// step: two exps, one conversion of both to bfloat16, one store, and the denominator summed from the rounded
// weights by one bfloat16 dot with ones (each product exact, so the same sum however the query is batched).
inline float list_weights(const float* x, int64_t len, float scale, uint16_t* wq, int64_t width) {
  const int64_t steps_q = (len + kStep - 1) / kStep;
  const float c = scale * 1.44269504088896341f;
  const __m512 cv = _mm512_set1_ps(c);
  const __m512bh ones = (__m512bh)_mm512_set1_epi16(0x3F80);  // bfloat16 1.0
  // the list's largest scaled score: its largest raw score (its smallest, were the scale negative)
  const bool largest = c >= 0;
  __m512 top = _mm512_set1_ps(largest ? -INFINITY : INFINITY);
  for (int64_t j = 0; j < len; j += kT) {
    const __mmask16 live = live_lanes(len - j);
    const __m512 v = _mm512_maskz_loadu_ps(live, x + j);
    top = largest ? _mm512_mask_max_ps(top, live, top, v) : _mm512_mask_min_ps(top, live, top, v);
  }
  const __m512 offset = _mm512_set1_ps(-(largest ? _mm512_reduce_max_ps(top) : _mm512_reduce_min_ps(top)) * c);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < steps_q * kStep; j += kStep) {
    const __m512 lo = exp2_weights(_mm512_fmadd_ps(_mm512_loadu_ps(x + j), cv, offset), live_lanes(len - j));
    const __m512 hi = exp2_weights(_mm512_fmadd_ps(_mm512_loadu_ps(x + j + kT), cv, offset),
                                   live_lanes(len - j - kT));
    const __m512bh w = _mm512_cvtne2ps_pbh(hi, lo);
    _mm512_storeu_si512(wq + j, (__m512i)w);
    sum = _mm512_dpbf16_ps(sum, w, ones);
  }
  std::fill(wq + steps_q * kStep, wq + width, 0);
  return _mm512_reduce_add_ps(sum);
}

// Every query's weights and denominator over its own list (`list_weights`): scores and w are [nq, width], query
// qi of row qi / group; a row whose list is not a prefix of the shared one (`shared`) first has its visible new
// keys' scores moved up behind the prefix, in its node order.
inline void query_weights(float* scores, uint16_t* w, float* total, int64_t nq, int64_t group, int64_t p,
                          const int64_t* count, const int64_t* visible, int64_t n_new, const std::vector<char>& shared,
                          float scale, int64_t width) {
  for (int64_t qi = 0; qi < nq; ++qi) {
    const int64_t r = qi / group, m = count[r];
    float* x = scores + qi * width;
    if (!shared[r])
      for (int64_t k = 0; k < m; ++k) x[p + k] = x[p + visible[r * n_new + k]];
    total[qi] = list_weights(x, p + m, scale, w + qi * width, width);
  }
}

// One row's own list from entry `from` on (a whole number of steps into the prefix), into `list`: the prefix's
// tail, then the row's `count` visible new keys (`row_visible`: indices into new_keys). Returns the length of
// the row's whole list.
inline int64_t own_list(const int64_t* prefix, int64_t p, int64_t from, const int64_t* new_keys,
                        const int64_t* row_visible, int64_t count, std::vector<int64_t>& list) {
  list.resize(p + count - from);
  std::copy(prefix + from, prefix + p, list.begin());
  for (int64_t c = 0; c < count; ++c) list[p - from + c] = new_keys[row_visible[c]];
  return p + count;
}

// V tiles of one step: entries `list[0 .. n)` (element offsets, n <= 32; the rest zero) -> D / 16 tiles, row i
// of each holding entries 2i and 2i + 1 interleaved (the pair layout of tdpbf16ps) for 16 dimensions. Per 32
// dimensions 32c .. 32c + 31, one unpack each (within 128-bit lanes, the cheap interleave) makes tile 2c of
// dimensions 32c + 8L + j and tile 2c + 1 of 32c + 8L + 4 + j, at column 4L + j (L, j < 4); `unshuffle`
// puts the outputs back in order.
inline void pack_values(const uint16_t* v_base, const int64_t* list, int64_t n, int64_t d, uint16_t* out) {
  for (int64_t i = 0; i < kStep / 2; ++i) {
    const uint16_t* x = 2 * i < n ? v_base + list[2 * i] : nullptr;
    const uint16_t* y = 2 * i + 1 < n ? v_base + list[2 * i + 1] : nullptr;
    for (int64_t c = 0; c < d; c += kStep) {
      const __m512i a = x ? _mm512_loadu_si512(x + c) : _mm512_setzero_si512();
      const __m512i b = y ? _mm512_loadu_si512(y + c) : _mm512_setzero_si512();
      _mm512_storeu_si512(out + (c / kT) * kT * kStep + i * kStep, _mm512_unpacklo_epi16(a, b));
      _mm512_storeu_si512(out + (c / kT + 1) * kT * kStep + i * kStep, _mm512_unpackhi_epi16(a, b));
    }
  }
}

// One output row in dimension order from its accumulators in pack_values' column order, divided by `total`.
inline void unshuffle(const float* acc, int64_t d, float total, float* out) {
  const __m512i first = _mm512_set_epi32(23, 22, 21, 20, 7, 6, 5, 4, 19, 18, 17, 16, 3, 2, 1, 0);
  const __m512i second = _mm512_add_epi32(first, _mm512_set1_epi32(8));
  const __m512 inv = _mm512_set1_ps(total);
  for (int64_t c = 0; c < d; c += kStep) {
    const __m512 lo = _mm512_loadu_ps(acc + c), hi = _mm512_loadu_ps(acc + c + kT);
    _mm512_storeu_ps(out + c, _mm512_div_ps(_mm512_permutex2var_ps(lo, first, hi), inv));
    _mm512_storeu_ps(out + c + kT, _mm512_div_ps(_mm512_permutex2var_ps(lo, second, hi), inv));
  }
}

