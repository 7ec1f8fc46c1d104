// Micro-benchmark for TransformerConv's fused design (bench/NOTES.md, "A design for
// TransformerConv's fused kernel"): is a float32 linear on tensor cores with the 3xTF32 split
// (each operand x = hi + lo, hi = tf32(x), lo = tf32(x - hi); acc += lo*hi + hi*lo + hi*hi
// with float32 accumulation) as accurate as cuBLAS's float32 SGEMM, and how much faster, at
// the layers' shapes (1M rows, 128 -> 128 / 512, 512 -> 128)? bench/emulate_3xtf32.py
// answered the first question on a CPU; this answers both on the GPU's own MMAs.
//
// Standalone (no torch): nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Icsrc
//   bench/micro_gemm_3xtf32.cu -lcublas -o /tmp/gemm && /tmp/gemm
// Prints, per shape: median ms of 20 (CUDA events, after 3 warm-up calls) for cuBLAS float32,
// cuBLAS TF32 (one pass), this kernel in 1xTF32 and 3xTF32; and each one's error against a
// float64 product of sampled rows, as max |err| / (|a| . |b|) over the sampled outputs.
//
// The kernel: C[M, N] = A[M, K] B[N, K]^T (+ bias), both operands K-contiguous (torch's
// x @ W.T): a CTA computes a 128 x 128 tile with 8 warps of 64 x 32, over K in steps of 32
// staged by cp.async in two buffers; mma.sync m16n8k8 tf32 (row.col). K % 4 == 0.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "gnnio/common/cp_async.cuh"

#define CHECK(x)                                                                      \
  do {                                                                                \
    cudaError_t e = (x);                                                              \
    if (e != cudaSuccess) {                                                           \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e), __FILE__, __LINE__); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

namespace {

constexpr int kBM = 128, kBN = 128, kBK = 32, kPitch = kBK + 4;  // +4: conflict-free fragments
constexpr int kThreads = 256;

__device__ inline uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

__device__ inline void mma_tf32(float* c, const uint32_t* a, const uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// One stage: rows [row0, row0 + 128) of a [rows, K] matrix, columns [k0, k0 + 32), into smem
// [128][kPitch]; out-of-range pieces are zeros.
__device__ inline void load_stage(float* smem, const float* g, int64_t rows, int K, int64_t row0,
                                  int k0) {
  for (int i = threadIdx.x; i < kBM * (kBK / 4); i += kThreads) {
    const int r = i / (kBK / 4), c = (i % (kBK / 4)) * 4;
    const int64_t gr = row0 + r;
    const bool valid = gr < rows && k0 + c < K;
    const float* src = valid ? g + gr * K + k0 + c : g;
    gnnio::cp_async16(smem + r * kPitch + c, src, valid);
  }
}

template <bool kSplit>
__global__ void __launch_bounds__(kThreads, 2)
    gemm_tn_kernel(const float* __restrict__ A, const float* __restrict__ B,
                   const float* __restrict__ bias, float* __restrict__ C, int64_t M, int N,
                   int K) {
  extern __shared__ float smem[];
  float* As = smem;                       // [2][kBM][kPitch]
  float* Bs = smem + 2 * kBM * kPitch;    // [2][kBN][kPitch]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int wm = (warp / 4) * 64, wn = (warp % 4) * 32;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * kBM;
  const int n0 = blockIdx.y * kBN;

  float acc[4][4][4] = {};
  const int steps = (K + kBK - 1) / kBK;
  load_stage(As, A, M, K, m0, 0);
  load_stage(Bs, B, N, K, n0, 0);
  gnnio::cp_async_commit();
  for (int s = 0; s < steps; ++s) {
    const int buf = s & 1;
    if (s + 1 < steps) {
      load_stage(As + (buf ^ 1) * kBM * kPitch, A, M, K, m0, (s + 1) * kBK);
      load_stage(Bs + (buf ^ 1) * kBN * kPitch, B, N, K, n0, (s + 1) * kBK);
    }
    gnnio::cp_async_commit();
    gnnio::cp_async_wait_all_but_newest();
    __syncthreads();
    const float* a_s = As + buf * kBM * kPitch;
    const float* b_s = Bs + buf * kBN * kPitch;
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 8) {
      uint32_t b_hi[4][2], b_lo[4][2];
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const float* p = b_s + (wn + nt * 8 + g) * kPitch + kk + t;
        const float v[2] = {p[0], p[4]};
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          b_hi[nt][i] = to_tf32(v[i]);
          if (kSplit) b_lo[nt][i] = to_tf32(v[i] - __uint_as_float(b_hi[nt][i]));
        }
      }
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        uint32_t a_hi[4], a_lo[4];
        const float* p = a_s + (wm + mt * 16 + g) * kPitch + kk + t;
        const float v[4] = {p[0], p[8 * kPitch], p[4], p[8 * kPitch + 4]};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          a_hi[i] = to_tf32(v[i]);
          if (kSplit) a_lo[i] = to_tf32(v[i] - __uint_as_float(a_hi[i]));
        }
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          if (kSplit) {
            mma_tf32(acc[mt][nt], a_lo, b_hi[nt]);
            mma_tf32(acc[mt][nt], a_hi, b_lo[nt]);
          }
          mma_tf32(acc[mt][nt], a_hi, b_hi[nt]);
        }
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      const int col = n0 + wn + nt * 8 + 2 * t;
      const float b0 = bias && col < N ? bias[col] : 0.f;
      const float b1 = bias && col + 1 < N ? bias[col + 1] : 0.f;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t row = m0 + wm + mt * 16 + g + 8 * h;
        if (row >= M) continue;
        float* out = C + row * N + col;
        if (col + 1 < N) {
          *reinterpret_cast<float2*>(out) =
              make_float2(acc[mt][nt][2 * h] + b0, acc[mt][nt][2 * h + 1] + b1);
        } else if (col < N) {
          out[0] = acc[mt][nt][2 * h] + b0;
        }
      }
    }
  }
}

template <bool kSplit>
void gemm_tn(const float* A, const float* B, const float* bias, float* C, int64_t M, int N,
             int K, cudaStream_t stream) {
  const size_t smem = 2 * (kBM + kBN) * kPitch * sizeof(float);
  static bool configured = false;
  if (!configured) {
    CHECK(cudaFuncSetAttribute(gemm_tn_kernel<kSplit>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    configured = true;
  }
  const dim3 grid((M + kBM - 1) / kBM, (N + kBN - 1) / kBN);
  gemm_tn_kernel<kSplit><<<grid, kThreads, smem, stream>>>(A, B, bias, C, M, N, K);
  CHECK(cudaGetLastError());
}

template <typename F>
float median_ms(F&& f) {
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  for (int i = 0; i < 3; ++i) f();
  std::vector<float> t;
  for (int i = 0; i < 20; ++i) {
    CHECK(cudaEventRecord(e0));
    f();
    CHECK(cudaEventRecord(e1));
    CHECK(cudaEventSynchronize(e1));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// max over sampled rows r and all n of |C[r, n] - exact| / sum_k |A[r, k] B[n, k]|.
double scaled_error(const std::vector<float>& hA, const std::vector<float>& hB,
                    const std::vector<float>& hC, const std::vector<int64_t>& rows, int N, int K) {
  double worst = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t r = rows[i];
    for (int n = 0; n < N; ++n) {
      double exact = 0, scale = 0;
      for (int k = 0; k < K; ++k) {
        const double p = double(hA[r * K + k]) * double(hB[(int64_t)n * K + k]);
        exact += p;
        scale += std::fabs(p);
      }
      worst = std::max(worst, std::fabs(double(hC[i * N + n]) - exact) / scale);
    }
  }
  return worst;
}

void run_shape(cublasHandle_t handle, int64_t M, int N, int K) {
  std::mt19937_64 rng(M * 131 + N * 7 + K);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> hA(M * K), hB((int64_t)N * K);
  for (auto& v : hA) v = dist(rng);
  const float wscale = 1.f / std::sqrt(float(K));
  for (auto& v : hB) v = dist(rng) * wscale;
  float *A, *B, *C;
  CHECK(cudaMalloc(&A, hA.size() * 4));
  CHECK(cudaMalloc(&B, hB.size() * 4));
  CHECK(cudaMalloc(&C, M * N * 4));
  CHECK(cudaMemcpy(A, hA.data(), hA.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(B, hB.data(), hB.size() * 4, cudaMemcpyHostToDevice));
  std::vector<int64_t> rows;
  for (int i = 0; i < 512; ++i) rows.push_back((int64_t)(rng() % M));
  rows.push_back(M - 1);
  auto sample = [&]() {
    std::vector<float> out(rows.size() * N);
    for (size_t i = 0; i < rows.size(); ++i)
      CHECK(cudaMemcpy(out.data() + i * N, C + rows[i] * N, N * 4, cudaMemcpyDeviceToHost));
    return scaled_error(hA, hB, out, rows, N, K);
  };
  const float one = 1.f, zero = 0.f;
  // Column-major cuBLAS: C^T[N, M] = B[N, K] (op T of the K x N col-major view) x A^T.
  auto cublas = [&](cublasComputeType_t compute) {
    return cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, N, (int)M, K, &one, B, CUDA_R_32F, K, A,
                        CUDA_R_32F, K, &zero, C, CUDA_R_32F, N, compute, CUBLAS_GEMM_DEFAULT);
  };
  const double gflop = 2.0 * M * N * K / 1e9;
  std::printf("shape M=%lld N=%d K=%d (%.1f GFLOP, %.0f MB moved at least)\n", (long long)M, N, K,
              gflop, (M * K + (double)N * K + M * N) * 4 / 1e6);
  struct Variant {
    const char* name;
    cublasComputeType_t compute;
    int kernel;  // 0 cuBLAS, 1 1xTF32 here, 3 3xTF32 here
  };
  const Variant variants[] = {{"cublas-fp32", CUBLAS_COMPUTE_32F, 0},
                              {"cublas-tf32", CUBLAS_COMPUTE_32F_FAST_TF32, 0},
                              {"cublas-bf16x9", CUBLAS_COMPUTE_32F_EMULATED_16BFX9, 0},
                              {"here-1xtf32", CUBLAS_COMPUTE_32F, 1},
                              {"here-3xtf32", CUBLAS_COMPUTE_32F, 3}};
  for (const auto& v : variants) {
    CHECK(cudaMemset(C, 0, M * N * 4));
    if (v.kernel == 0) {
      const cublasStatus_t st = cublas(v.compute);
      if (st != CUBLAS_STATUS_SUCCESS) {
        std::printf("  %-14s cuBLAS status %d (not supported here)\n", v.name, (int)st);
        continue;
      }
    }
    auto call = [&]() {
      if (v.kernel == 0) cublas(v.compute);
      else if (v.kernel == 1) gemm_tn<false>(A, B, nullptr, C, M, N, K, 0);
      else gemm_tn<true>(A, B, nullptr, C, M, N, K, 0);
    };
    call();
    CHECK(cudaDeviceSynchronize());
    const double err = sample();
    const float ms = median_ms(call);
    std::printf("  %-14s %8.3f ms  %7.1f TFLOP/s  max scaled error %.3e\n", v.name, ms,
                gflop / ms, err);
  }
  CHECK(cudaFree(A));
  CHECK(cudaFree(B));
  CHECK(cudaFree(C));
}

}  // namespace

int main(int argc, char** argv) {
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  cublasHandle_t handle;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) return 1;
  const int64_t M = argc > 1 ? std::atoll(argv[1]) : 1000000;
  run_shape(handle, M, 512, 128);   // TransformerConv's q, k, v, skip in one
  run_shape(handle, M, 128, 128);   // one 128 -> 128 linear
  run_shape(handle, M, 128, 512);   // the backward's d x from the four linears' gradients
  run_shape(handle, 1003, 72, 36);  // ragged: tails in every dimension
  cublasDestroy(handle);
  return 0;
}
