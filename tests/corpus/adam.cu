// SPDX-License-Identifier: Apache-2.0
// Corpus: an Adam optimizer step (sqrtf, powf, division) in float and double.
template <typename T>
__global__ void adam_step(T* param, const T* grad, T* m, T* v, T lr, T beta1, T beta2, T eps,
                          T weight_decay, int step, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= n) return;
  T g = grad[i] + weight_decay * param[i];
  T mi = beta1 * m[i] + (T(1) - beta1) * g;
  T vi = beta2 * v[i] + (T(1) - beta2) * g * g;
  m[i] = mi;
  v[i] = vi;
  T mhat = mi / (T(1) - pow(beta1, (T)step));
  T vhat = vi / (T(1) - pow(beta2, (T)step));
  param[i] -= lr * mhat / (sqrt(vhat) + eps);
}

template __global__ void adam_step<float>(float*, const float*, float*, float*, float, float,
                                          float, float, float, int, long long);
template __global__ void adam_step<double>(double*, const double*, double*, double*, double,
                                           double, double, double, double, int, long long);

extern "C" __global__ void sgd_momentum(float* __restrict__ p, const float* __restrict__ g,
                                        float* __restrict__ buf, float lr, float mu, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    float b = mu * buf[i] + g[i];
    buf[i] = b;
    p[i] -= lr * b;
  }
}
