// SPDX-License-Identifier: Apache-2.0
// Kernels of the MLP example: every output element is computed by one thread
// summing in a fixed order, so results are bit-identical from run to run.
extern "C" {

// Y[i][j] = act(sum_k X[i][k] * W[k][j] + b[j]) for an (rows x k) by (k x n) product.
__global__ void linear_forward(const float* __restrict__ x, const float* __restrict__ w,
                               const float* __restrict__ b, float* __restrict__ y, int rows,
                               int k, int n, int relu) {
  int i = blockIdx.y * blockDim.y + threadIdx.y;
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= rows || j >= n) return;
  float acc = b[j];
  for (int t = 0; t < k; ++t) acc = fmaf(x[i * k + t], w[t * n + j], acc);
  y[i * n + j] = relu && acc < 0.0f ? 0.0f : acc;
}

// Softmax cross-entropy per row: losses[i] and dlogits = (softmax - onehot) / rows.
__global__ void softmax_xent(const float* __restrict__ logits, const int* __restrict__ labels,
                             float* __restrict__ dlogits, float* __restrict__ losses, int rows,
                             int classes) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= rows) return;
  const float* z = logits + i * classes;
  float m = z[0];
  for (int c = 1; c < classes; ++c) m = fmaxf(m, z[c]);
  float sum = 0.0f;
  for (int c = 0; c < classes; ++c) sum += expf(z[c] - m);
  int y = labels[i];
  losses[i] = logf(sum) - (z[y] - m);
  float inv = 1.0f / (sum * rows);
  for (int c = 0; c < classes; ++c) {
    dlogits[i * classes + c] = expf(z[c] - m) * inv - (c == y ? 1.0f / rows : 0.0f);
  }
}

// out[0] = mean of v[0..n): one block of 256 threads, a fixed reduction tree.
__global__ void mean_256(const float* __restrict__ v, float* __restrict__ out, int n) {
  __shared__ float partial[256];
  float acc = 0.0f;
  for (int i = threadIdx.x; i < n; i += 256) acc += v[i];
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int stride = 128; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = partial[0] / n;
}

// dW[a][c] = sum_r A[r][a] * G[r][c]: the weight gradient of a linear layer.
__global__ void weight_grad(const float* __restrict__ a, const float* __restrict__ g,
                            float* __restrict__ dw, int rows, int ka, int nc) {
  int r = blockIdx.y * blockDim.y + threadIdx.y;
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= ka || c >= nc) return;
  float acc = 0.0f;
  for (int t = 0; t < rows; ++t) acc = fmaf(a[t * ka + r], g[t * nc + c], acc);
  dw[r * nc + c] = acc;
}

// db[c] = sum_r G[r][c].
__global__ void bias_grad(const float* __restrict__ g, float* __restrict__ db, int rows, int nc) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= nc) return;
  float acc = 0.0f;
  for (int t = 0; t < rows; ++t) acc += g[t * nc + c];
  db[c] = acc;
}

// dh[r][j] = (h[r][j] > 0) * sum_c G[r][c] * W[j][c]: back through a ReLU layer.
__global__ void hidden_grad(const float* __restrict__ g, const float* __restrict__ w,
                            const float* __restrict__ h, float* __restrict__ dh, int rows,
                            int hidden, int classes) {
  int r = blockIdx.y * blockDim.y + threadIdx.y;
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows || j >= hidden) return;
  float acc = 0.0f;
  for (int c = 0; c < classes; ++c) acc = fmaf(g[r * classes + c], w[j * classes + c], acc);
  dh[r * hidden + j] = h[r * hidden + j] > 0.0f ? acc : 0.0f;
}

__global__ void sgd_step(float* __restrict__ w, const float* __restrict__ g, float lr, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) w[i] -= lr * g[i];
}

// The "optimizer state" of --state-mib: each step mixes the step's loss and the
// first layer's weights into one window of `n` words of the state, four words
// per thread. Integer arithmetic: exact, so a run and its restored twin agree
// bit for bit.
__global__ void state_update(uint4* __restrict__ state, const float* __restrict__ loss,
                             const float* __restrict__ w, int nw, int n, unsigned int step) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n / 4) return;
  unsigned int mix = __float_as_uint(*loss) ^ step;
  uint4 s = state[i];
  unsigned int* words[4] = {&s.x, &s.y, &s.z, &s.w};
  for (int k = 0; k < 4; ++k) {
    unsigned int v = *words[k] * 1664525u + (mix ^ __float_as_uint(w[(4 * i + k) % nw]));
    *words[k] = v ^ (v >> 15);
  }
  state[i] = s;
}

}  // extern "C"
