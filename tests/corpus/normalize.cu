// SPDX-License-Identifier: Apache-2.0
// Corpus: row softmax and layernorm (expf, rsqrtf, dynamic shared memory).
// Largest finite float; <cfloat> is not available under NVRTC.
constexpr float kFltMax = 3.402823466e38f;

extern "C" __global__ void softmax_rows(const float* x, float* y, int cols) {
  extern __shared__ float scratch[];
  const float* row = x + (size_t)blockIdx.x * cols;
  float* out = y + (size_t)blockIdx.x * cols;
  float m = -kFltMax;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, row[c]);
  scratch[threadIdx.x] = m;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) scratch[threadIdx.x] = fmaxf(scratch[threadIdx.x], scratch[threadIdx.x + s]);
    __syncthreads();
  }
  m = scratch[0];
  __syncthreads();
  float sum = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) sum += expf(row[c] - m);
  scratch[threadIdx.x] = sum;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) scratch[threadIdx.x] += scratch[threadIdx.x + s];
    __syncthreads();
  }
  float inv = 1.0f / scratch[0];
  for (int c = threadIdx.x; c < cols; c += blockDim.x) out[c] = __expf(row[c] - m) * inv;
}

extern "C" __global__ void layernorm(const float* x, const float* gamma, const float* beta,
                                     float* y, int cols, float eps) {
  extern __shared__ float buf[];
  float* sums = buf;
  float* sqs = buf + blockDim.x;
  const float* row = x + (size_t)blockIdx.x * cols;
  float s = 0.f, q = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    float v = row[c];
    s += v;
    q += v * v;
  }
  sums[threadIdx.x] = s;
  sqs[threadIdx.x] = q;
  __syncthreads();
  for (int st = blockDim.x / 2; st > 0; st >>= 1) {
    if (threadIdx.x < st) {
      sums[threadIdx.x] += sums[threadIdx.x + st];
      sqs[threadIdx.x] += sqs[threadIdx.x + st];
    }
    __syncthreads();
  }
  float mean = sums[0] / cols;
  float var = sqs[0] / cols - mean * mean;
  float rstd = rsqrtf(var + eps);
  for (int c = threadIdx.x; c < cols; c += blockDim.x)
    y[(size_t)blockIdx.x * cols + c] = (row[c] - mean) * rstd * gamma[c] + beta[c];
}

extern "C" __global__ void gelu_tanh(const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    float v = x[i];
    y[i] = 0.5f * v * (1.f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v))) + logf(1.f + sinf(v) * cosf(v) * 0.1f);
  }
}
