// Fused CPU forward of chunked gated linear attention (float32, one real or complex decay per head).
//
// Computes, per batch and head, exactly what attnspec.ops.linear._chunked computes:
//
//     S_t = a_t S_(t-1) + k_t^T v_t,    o_t = Re(scale * q_t S_t),    a_t = exp(log|a|_t + i theta_t) (or 1)
//
// chunk by chunk. For a chunk of m <= C positions with b_i = sum_{s <= i} max(log|a|_s, log_zero)
// and phi_i = sum_{s <= i} theta_s (both accumulated in double, as the graph path does):
//
//     o_i   = sum_{j <= i} (scale q_i . k_j) exp(b_i - b_j) cos(phi_i - phi_j) v_j
//             + Re(scale exp(b_i + i phi_i) q_i S_prev)
//     S_new = exp(b_m + i phi_m) S_prev  +  sum_j exp(b_m - b_j + i (phi_m - phi_j)) k_j^T v_j
//
// A complex state is carried as its real and imaginary parts; for real decays phi = 0 and the
// imaginary part stays 0.
//
// Why a hand-written kernel: the graph path runs these as four batched 64x64x64 matrix products
// per chunk through MKL, which packs every operand again (about as costly as the product at this
// size) and leaves the decays, the state scan and the output to separate passes over memory.
// Here one thread owns one (batch, head) and walks its chunks in order: q, k, v of a chunk and
// the state stay in L1/L2, the cross-chunk recurrence is the loop itself (no scan, no padding),
// and the causal upper triangle of the scores is skipped block by block.
//
// Plain C ABI (called with ctypes): no torch headers, so it builds in about a second with the
// system compiler. Vectors are GCC/Clang vector extensions of the widest width the target has
// (16 floats with AVX-512, else 8), so -march=native picks the instructions.
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <utility>

#if defined(__AVX512F__)
#define W 16      // floats per vector
#define NV_MAX 4  // vectors per tile row: 4 x 4 accumulators + 4 operands fit in 32 registers
#else
#define W 8
#define NV_MAX 2  // 16 registers: 4 x 2 accumulators + 2 operands
#endif
#define R 4  // rows per tile

typedef float vec __attribute__((vector_size(W * 4)));
typedef float unaligned_vec __attribute__((vector_size(W * 4), aligned(4)));
typedef int32_t ivec __attribute__((vector_size(W * 4)));
typedef double dvec __attribute__((vector_size(W * 8)));
typedef double unaligned_dvec __attribute__((vector_size(W * 8), aligned(8)));


static inline vec load(const float *p) { return *(const unaligned_vec *)p; }
static inline void store(float *p, vec x) { *(unaligned_vec *)p = x; }
static inline vec splat(float x) { return vec{} + x; }
static inline long round_up(long x, long m) { return (x + m - 1) / m * m; }

// exp of every lane: relative error below 2e-7 (Cephes' expf polynomial after reduction by ln 2),
// exactly 1 at 0 and exactly 0 below -87.3 (where float32 exp is denormal or 0).
static inline vec vector_exp(vec x) {
  const ivec underflow = x < -87.3f;
  x = x < -87.3f ? splat(-87.3f) : x;
  x = x > 88.3f ? splat(88.3f) : x;
  const vec rounded = x * 1.44269504088896341f + 0.5f;
  ivec n = __builtin_convertvector(rounded, ivec);  // truncates towards 0 ...
  n += (ivec)(__builtin_convertvector(n, vec) > rounded);  // ... -1 where that was up: floor
  const vec nf = __builtin_convertvector(n, vec);
  x = x - nf * 0.693359375f + nf * 2.12194440e-4f;  // x - n ln 2 in two parts
  vec y = splat(1.9875691500E-4f);
  y = y * x + 1.3981999507E-3f;
  y = y * x + 8.3334519073E-3f;
  y = y * x + 4.1665795894E-2f;
  y = y * x + 1.6666665459E-1f;
  y = y * x + 5.0000001201E-1f;
  y = y * (x * x) + x + 1.0f;
  const ivec bits = (n + 127) << 23;  // 2^n
  vec power;
  memcpy(&power, &bits, sizeof(power));
  return underflow ? splat(0.f) : y * power;
}

// acc[r][v] += sum_{p < depth} A(r, p) * B(p, v W .. v W + W - 1), the register tile of every
// product below. A(r, p) = a[r * a_row + p * a_col] is broadcast; row p of B starts at b + p * b_row.
template <int NV>
static inline __attribute__((always_inline)) void multiply_add(vec (&acc)[R][NV_MAX], const float *a, long a_row,
                                                                long a_col, const float *b, long b_row, long depth) {
  for (long p = 0; p < depth; p++) {
    vec row[NV];
    for (int v = 0; v < NV; v++) row[v] = load(b + p * b_row + v * W);
    for (int r = 0; r < R; r++) {
      const vec ar = splat(a[r * a_row + p * a_col]);
      for (int v = 0; v < NV; v++) acc[r][v] += ar * row[v];
    }
  }
}

// The per-thread copy of one chunk (zero-padded to whole tiles) and the state.
struct Workspace {
  long CP, CR, DkR, DvP;    // C and Dv rounded up to vectors, C and Dk rounded up to tile rows
  float *state, *state_im;  // DkR x DvP each: the state entering the chunk (real, imaginary part)
  float *next, *next_im;    // DkR x DvP each: the state leaving it (complex decays only)
  float *q;                 // CR x Dk: scale q_i
  float *q_decayed;         // CR x Dk: Re(scale q_i exp(b_i + i phi_i))
  float *q_decayed_im;      // CR x Dk: -Im(scale q_i exp(b_i + i phi_i)) (negated: the read is a sum)
  float *k_transposed;      // Dk x CP: k_j in column j
  float *k_decayed;         // CP x DkR: Re(k_j exp(b_m - b_j + i (phi_m - phi_j)))
  float *k_decayed_im;      // CP x DkR: Im(...)
  float *v;                 // CP x DvP
  float *scores;            // CR x CP: (scale q_i . k_j) exp(b_i - b_j) cos(phi_i - phi_j) for j <= i, else 0
  double *log_decay;        // CP + W: b_i, held at b_m past the chunk's end
  double *phase_cos;        // CP + W: cos(phi_i), likewise
  double *phase_sin;        // CP + W: sin(phi_i)
  size_t floats;
};

// The decay across a whole chunk, exp(b_m + i phi_m).
struct ChunkDecay {
  float magnitude, cos, sin;
};

// Carves the workspace out of base (or, with base null, only counts its floats).
static Workspace layout(long C, long Dk, long Dv, float *base) {
  Workspace w;
  w.CP = round_up(C, W), w.CR = round_up(C, R), w.DkR = round_up(Dk, R), w.DvP = round_up(Dv, W);
  long at = 0;
  auto take = [&](long floats) {
    float *p = base ? base + at : nullptr;
    at += floats;
    return p;
  };
  // What real decays use first and together (cache sets), the complex-only buffers after.
  w.state = take(w.DkR * w.DvP);
  w.q = take(w.CR * Dk);
  w.q_decayed = take(w.CR * Dk);
  w.k_transposed = take(Dk * w.CP);
  w.k_decayed = take(w.CP * w.DkR);
  w.v = take(w.CP * w.DvP);
  w.scores = take(w.CR * w.CP);
  w.state_im = take(w.DkR * w.DvP);
  w.next = take(w.DkR * w.DvP);
  w.next_im = take(w.DkR * w.DvP);
  w.q_decayed_im = take(w.CR * Dk);
  w.k_decayed_im = take(w.CP * w.DkR);
  at += at & 1;  // 8-byte alignment for the doubles
  w.log_decay = (double *)take(2 * (w.CP + W));
  w.phase_cos = (double *)take(2 * (w.CP + W));
  w.phase_sin = (double *)take(2 * (w.CP + W));
  w.floats = at;
  return w;
}

struct Problem {
  const float *q, *k, *v, *log_a, *phase, *initial, *initial_im;
  // Element strides: q, k, v (b, h, l, d); log_a, phase (b, h, l); initial, initial_im (b, h, dk, dv).
  int64_t sq[4], sk[4], sv[4], sa[3], sp[3], si[4], sj[4];
  long B, H, L, Dk, Dv, C;
  float scale;
  double log_zero;  // log|a| at or below this is a = 0 (attnspec.ops.linear.LOG_ZERO, passed in)
  float *out;                 // (B, H, L, Dv), contiguous
  float *final, *final_im;    // (B, H, Dk, Dv) each, contiguous
  int threads;
  long splits, block;  // each head's value columns are split into `splits` blocks of `block` columns
};

// The value columns first .. first + count - 1 of one head: the unit of work of one thread.
struct Columns {
  long first, count;
};

// Scores of rows i0 .. i0 + R - 1 against columns j0 .. j0 + NV W - 1, decayed and causally masked.
template <int NV, bool ROTATING>
static inline void scores_tile(const Workspace &w, long Dk, long i0, long j0) {
  vec acc[R][NV_MAX];
  for (int r = 0; r < R; r++)
    for (int v = 0; v < NV; v++) acc[r][v] = splat(0.f);
  multiply_add<NV>(acc, w.q + i0 * Dk, Dk, 1, w.k_transposed + j0, w.CP, Dk);
  ivec column;
  for (int l = 0; l < W; l++) column[l] = l;
  for (int r = 0; r < R; r++) {
    const long i = i0 + r;
    for (int v = 0; v < NV; v++) {
      const long j = j0 + v * W;
      // b_i - b_j in double (b reaches C * log_zero; float32 would lose the small differences), then exp.
      const vec diff = __builtin_convertvector(w.log_decay[i] - *(const unaligned_dvec *)(w.log_decay + j), vec);
      vec decay = vector_exp(diff);
      if (ROTATING) {  // cos(phi_i - phi_j) = cos phi_i cos phi_j + sin phi_i sin phi_j
        const vec cos_j = __builtin_convertvector(*(const unaligned_dvec *)(w.phase_cos + j), vec);
        const vec sin_j = __builtin_convertvector(*(const unaligned_dvec *)(w.phase_sin + j), vec);
        decay *= (float)w.phase_cos[i] * cos_j + (float)w.phase_sin[i] * sin_j;
      }
      const ivec causal = column + (int)j <= (int)i;
      // A select, not a product with a 0/1 mask: above the diagonal exp(b_i - b_j) may be inf.
      store(w.scores + i * w.CP + j, causal ? acc[r][v] * decay : splat(0.f));
    }
  }
}

// Output rows i0 .. i0 + R - 1, columns e0 .. e0 + NV W - 1: decayed scores times v plus the
// decayed queries times the state entering the chunk. Only the first Dv columns are written, to
// rows of out_row floats.
template <int NV, bool ROTATING>
static inline void output_tile(const Workspace &w, long Dk, long Dv, long out_row, long i0, long e0,
                               long m, float *out) {
  vec acc[R][NV_MAX];
  for (int r = 0; r < R; r++)
    for (int v = 0; v < NV; v++) acc[r][v] = splat(0.f);
  const long depth = i0 + R < m ? i0 + R : m;  // scores vanish for j > i
  multiply_add<NV>(acc, w.scores + i0 * w.CP, w.CP, 1, w.v + e0, w.DvP, depth);
  multiply_add<NV>(acc, w.q_decayed + i0 * Dk, Dk, 1, w.state + e0, w.DvP, Dk);
  if (ROTATING) multiply_add<NV>(acc, w.q_decayed_im + i0 * Dk, Dk, 1, w.state_im + e0, w.DvP, Dk);
  for (int r = 0; r < R && i0 + r < m; r++) {
    float *row = out + (i0 + r) * out_row;
    for (int v = 0; v < NV; v++) {
      const long e = e0 + v * W;
      if (e + W <= Dv) {
        store(row + e, acc[r][v]);
      } else {
        for (long l = 0; e + l < Dv; l++) row[e + l] = acc[r][v][l];
      }
    }
  }
}

// State rows d0 .. d0 + R - 1, columns e0 .., real decays, in place:
// exp(b_m) S + sum_j (k_j exp(b_m - b_j))^T v_j.
template <int NV>
static inline void state_tile(const Workspace &w, ChunkDecay a, long d0, long e0, long m) {
  vec acc[R][NV_MAX];
  float *rows = w.state + d0 * w.DvP + e0;
  for (int r = 0; r < R; r++)
    for (int v = 0; v < NV; v++) acc[r][v] = load(rows + r * w.DvP + v * W) * a.magnitude;
  multiply_add<NV>(acc, w.k_decayed + d0, 1, w.DkR, w.v + e0, w.DvP, m);
  for (int r = 0; r < R; r++)
    for (int v = 0; v < NV; v++) store(rows + r * w.DvP + v * W, acc[r][v]);
}

// The same for complex decays, into the next-state buffers (both parts read both old parts):
// real part  |a| (cos phi_m S_re - sin phi_m S_im) + sum_j Re(k~_j)^T v_j, and with `imaginary`
// the imaginary part |a| (sin phi_m S_re + cos phi_m S_im) + sum_j Im(k~_j)^T v_j.
template <int NV, bool IMAGINARY>
static inline void rotating_state_tile(const Workspace &w, ChunkDecay a, long d0, long e0, long m) {
  constexpr bool imaginary = IMAGINARY;
  const float from_re = a.magnitude * (imaginary ? a.sin : a.cos);
  const float from_im = a.magnitude * (imaginary ? a.cos : -a.sin);
  const long at = d0 * w.DvP + e0;
  vec acc[R][NV_MAX];
  for (int r = 0; r < R; r++)
    for (int v = 0; v < NV; v++) {
      const long offset = at + r * w.DvP + v * W;
      acc[r][v] = load(w.state + offset) * from_re + load(w.state_im + offset) * from_im;
    }
  multiply_add<NV>(acc, (imaginary ? w.k_decayed_im : w.k_decayed) + d0, 1, w.DkR, w.v + e0, w.DvP, m);
  float *rows = (imaginary ? w.next_im : w.next) + at;
  for (int r = 0; r < R; r++)
    for (int v = 0; v < NV; v++) store(rows + r * w.DvP + v * W, acc[r][v]);
}

// Runs `call` with a compile-time NV equal to the runtime nv in 1 .. NV_MAX (the tile width is a
// template parameter so that the accumulators stay in registers).
#define WITH_WIDTH(nv, call)                                   \
  switch (nv) {                                                \
    case 1: { constexpr int NV = 1; call; } break;             \
    case 2: { constexpr int NV = 2; call; } break;             \
    case 3: { constexpr int NV = NV_MAX < 3 ? NV_MAX : 3; call; } break; \
    default: { constexpr int NV = NV_MAX; call; } break;       \
  }

static inline long tile_vectors(long remaining_vectors) {
  return remaining_vectors < NV_MAX ? remaining_vectors : NV_MAX;
}

// Copies positions t0 .. t0 + m - 1 of one head into the workspace and fills b (log_decay) and,
// for complex decays, cos/sin phi. Returns the decay across the chunk.
template <bool ROTATING>
static ChunkDecay load_chunk(const Problem &P, const Workspace &w, const float *q, const float *k, const float *v,
                             const float *log_a, const float *phase, long Dv, long t0, long m) {
  const long Dk = P.Dk;
  double total = 0.0, angle = 0.0;
  for (long i = 0; i < m; i++) {
    const double x = log_a ? log_a[(t0 + i) * P.sa[2]] : 0.0;
    total += x < P.log_zero ? P.log_zero : x;  // clamped: -inf (a reset) must not make inf - inf below
    w.log_decay[i] = total;
    if (ROTATING) {
      angle += phase[(t0 + i) * P.sp[2]];
      w.phase_cos[i] = cos(angle), w.phase_sin[i] = sin(angle);
    }
  }
  const double end_cos = ROTATING ? cos(angle) : 1.0, end_sin = ROTATING ? sin(angle) : 0.0;
  for (long i = m; i < w.CP + W; i++) w.log_decay[i] = total, w.phase_cos[i] = end_cos, w.phase_sin[i] = end_sin;
  for (long i = 0; i < m; i++) {
    const float *qi = q + (t0 + i) * P.sq[2], *ki = k + (t0 + i) * P.sk[2], *vi = v + (t0 + i) * P.sv[2];
    const double from_start = exp(w.log_decay[i]), to_end = exp(total - w.log_decay[i]);
    // exp(i phi_i), and exp(i (phi_m - phi_i)) by the angle-difference identities.
    const double c = ROTATING ? w.phase_cos[i] : 1.0, s = ROTATING ? w.phase_sin[i] : 0.0;
    const float q_re = (float)(from_start * c), q_im = (float)(-from_start * s);
    const float k_re = (float)(to_end * (end_cos * c + end_sin * s));
    const float k_im = (float)(to_end * (end_sin * c - end_cos * s));
    for (long d = 0; d < Dk; d++) {
      const float qs = qi[d * P.sq[3]] * P.scale, kd = ki[d * P.sk[3]];
      w.q[i * Dk + d] = qs;
      w.q_decayed[i * Dk + d] = qs * q_re;
      w.k_transposed[d * w.CP + i] = kd;
      w.k_decayed[i * w.DkR + d] = kd * k_re;
      if (ROTATING) w.q_decayed_im[i * Dk + d] = qs * q_im, w.k_decayed_im[i * w.DkR + d] = kd * k_im;
    }
    for (long e = 0; e < Dv; e++) w.v[i * w.DvP + e] = vi[e * P.sv[3]];
  }
  // A short (last) chunk: clear what the previous chunk left in the rows past m.
  for (long i = m; i < w.CR; i++) {
    memset(w.q + i * Dk, 0, sizeof(float) * Dk);
    memset(w.q_decayed + i * Dk, 0, sizeof(float) * Dk);
    memset(w.q_decayed_im + i * Dk, 0, sizeof(float) * Dk);
  }
  for (long i = m; i < w.CP; i++) {
    for (long d = 0; d < Dk; d++) w.k_transposed[d * w.CP + i] = 0.f;
    memset(w.k_decayed + i * w.DkR, 0, sizeof(float) * w.DkR);
    memset(w.k_decayed_im + i * w.DkR, 0, sizeof(float) * w.DkR);
    memset(w.v + i * w.DvP, 0, sizeof(float) * w.DvP);
  }
  return ChunkDecay{(float)exp(total), (float)end_cos, (float)end_sin};
}

// The chunks of one head in order (state in w.state/w.state_im on entry and on return).
template <bool ROTATING>
static void walk_chunks(const Problem &P, Workspace &w, const float *q, const float *k, const float *v,
                        const float *log_a, const float *phase, long Dv, float *out) {
  const long Dk = P.Dk, L = P.L, C = P.C;
  for (long t0 = 0; t0 < L; t0 += C) {
    const long m = L - t0 < C ? L - t0 : C;
    const ChunkDecay chunk_decay = load_chunk<ROTATING>(P, w, q, k, v, log_a, phase, Dv, t0, m);
    const long rows = round_up(m, R);
    for (long i0 = 0; i0 < rows; i0 += R) {
      const long vectors = (i0 + R - 1) / W + 1;  // the column vectors that hold some j <= i0 + R - 1
      for (long v0 = 0; v0 < vectors; v0 += NV_MAX)
        WITH_WIDTH(tile_vectors(vectors - v0), (scores_tile<NV, ROTATING>(w, Dk, i0, v0 * W)));
    }
    for (long i0 = 0; i0 < rows; i0 += R)
      for (long e0 = 0; e0 < w.DvP; e0 += NV_MAX * W)
        WITH_WIDTH(tile_vectors((w.DvP - e0) / W),
                   (output_tile<NV, ROTATING>(w, Dk, Dv, P.Dv, i0, e0, m, out + t0 * P.Dv)));
    for (long d0 = 0; d0 < w.DkR; d0 += R)  // after the output: the output reads the entering state
      for (long e0 = 0; e0 < w.DvP; e0 += NV_MAX * W) {
        if (ROTATING) {
          WITH_WIDTH(tile_vectors((w.DvP - e0) / W), (rotating_state_tile<NV, false>(w, chunk_decay, d0, e0, m)));
          WITH_WIDTH(tile_vectors((w.DvP - e0) / W), (rotating_state_tile<NV, true>(w, chunk_decay, d0, e0, m)));
        } else {
          WITH_WIDTH(tile_vectors((w.DvP - e0) / W), (state_tile<NV>(w, chunk_decay, d0, e0, m)));
        }
      }
    if (ROTATING) std::swap(w.state, w.next), std::swap(w.state_im, w.next_im);
  }
}

static void one_head(const Problem &P, long b, long h, Columns columns, Workspace w) {
  const long Dk = P.Dk, Dv = columns.count;
  const float *q = P.q + b * P.sq[0] + h * P.sq[1];
  const float *k = P.k + b * P.sk[0] + h * P.sk[1];
  const float *v = P.v + b * P.sv[0] + h * P.sv[1] + columns.first * P.sv[3];
  const float *log_a = P.log_a ? P.log_a + b * P.sa[0] + h * P.sa[1] : nullptr;
  const float *phase = P.phase ? P.phase + b * P.sp[0] + h * P.sp[1] : nullptr;
  float *out = P.out + (b * P.H + h) * P.L * P.Dv + columns.first;

  memset(w.state, 0, sizeof(float) * w.floats);  // the whole workspace: padding must be 0
  const float *initial[2] = {P.initial, P.initial_im};
  const int64_t *strides[2] = {P.si, P.sj};
  float *state[2] = {w.state, w.state_im};
  for (int part = 0; part < 2; part++) {
    if (!initial[part]) continue;
    const int64_t *st = strides[part];
    const float *s0 = initial[part] + b * st[0] + h * st[1] + columns.first * st[3];
    for (long d = 0; d < Dk; d++)
      for (long e = 0; e < Dv; e++) state[part][d * w.DvP + e] = s0[d * st[2] + e * st[3]];
  }
  if (phase)
    walk_chunks<true>(P, w, q, k, v, log_a, phase, Dv, out);
  else
    walk_chunks<false>(P, w, q, k, v, log_a, nullptr, Dv, out);
  float *final[2] = {P.final + (b * P.H + h) * Dk * P.Dv + columns.first,
                     P.final_im + (b * P.H + h) * Dk * P.Dv + columns.first};
  const float *last[2] = {w.state, w.state_im};  // the imaginary part stays 0 for real decays
  for (int part = 0; part < 2; part++)
    for (long d = 0; d < Dk; d++)
      for (long e = 0; e < Dv; e++) final[part][d * P.Dv + e] = last[part][d * w.DvP + e];
}

struct Worker {
  const Problem *P;
  int index;
  int failed;
};

// Work items index, index + threads, ...: equal shares, and a (head, column block) never moves
// between threads.
static void *run_worker(void *arg) {
  Worker *worker = (Worker *)arg;
  const Problem &P = *worker->P;
  const size_t bytes = round_up(sizeof(float) * layout(P.C, P.Dk, P.block, nullptr).floats, 64);
  float *memory = (float *)aligned_alloc(64, bytes);
  if (!memory) {
    worker->failed = 1;
    return nullptr;
  }
  const Workspace w = layout(P.C, P.Dk, P.block, memory);
  for (long item = worker->index; item < P.B * P.H * P.splits; item += P.threads) {
    const long bh = item / P.splits, first = item % P.splits * P.block;
    const Columns columns{first, P.Dv - first < P.block ? P.Dv - first : P.block};
    one_head(P, bh / P.H, bh % P.H, columns, w);
  }
  free(memory);
  return nullptr;
}

// Returns 0 on success, 1 if a workspace could not be allocated (the output is then incomplete).
// log_a, phase, initial and initial_im may be null (no decay, a real decay, a zero initial state,
// a real one). strides: q, k, v (4 each), log_a, phase (3 each), initial, initial_im (4 each).
extern "C" int chunked_linear_attention_forward(const float *q, const float *k, const float *v, const float *log_a,
                                                const float *phase, const float *initial, const float *initial_im,
                                                const int64_t *strides, int64_t B, int64_t H, int64_t L, int64_t Dk,
                                                int64_t Dv, int64_t C, float scale, double log_zero, float *out,
                                                float *final, float *final_im, int threads) {
  const int MAX_THREADS = 256;
  Problem P{q, k, v, log_a, phase, initial, initial_im, {}, {}, {}, {}, {}, {}, {}, B, H, L, Dk, Dv, C, scale,
            log_zero, out, final, final_im, threads, 1, 0};
  int64_t *parts[7] = {P.sq, P.sk, P.sv, P.sa, P.sp, P.si, P.sj};
  const int sizes[7] = {4, 4, 4, 3, 3, 4, 4};
  for (int part = 0, at = 0; part < 7; at += sizes[part], part++)
    memcpy(parts[part], strides + at, sizes[part] * sizeof(int64_t));
  if (B * H == 0 || Dv == 0) return 0;
  // Fewer heads than threads: split each head's value columns (whole vectors) between threads.
  // Each block recomputes the head's scores, a quarter of the work at Dk = Dv = C.
  const long heads = B * H, vectors = round_up(Dv, W) / W;
  long splits = heads < threads ? (threads + heads - 1) / heads : 1;
  splits = splits < vectors ? splits : vectors;
  P.block = (vectors + splits - 1) / splits * W;
  P.splits = (Dv + P.block - 1) / P.block;
  const long items = heads * P.splits, limit = items < MAX_THREADS ? items : MAX_THREADS;
  P.threads = threads < 1 ? 1 : (threads > limit ? (int)limit : threads);
  pthread_t ids[MAX_THREADS];
  bool started[MAX_THREADS] = {};
  Worker workers[MAX_THREADS];
  for (int t = 0; t < P.threads; t++) workers[t] = Worker{&P, t, 0};
  for (int t = 1; t < P.threads; t++) started[t] = pthread_create(&ids[t], nullptr, run_worker, &workers[t]) == 0;
  run_worker(&workers[0]);
  for (int t = 1; t < P.threads; t++) {
    if (started[t])
      pthread_join(ids[t], nullptr);
    else
      run_worker(&workers[t]);  // no thread could be started for this share: run it here
  }
  for (int t = 0; t < P.threads; t++)
    if (workers[t].failed) return 1;
  return 0;
}
