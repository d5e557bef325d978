// SPDX-License-Identifier: Apache-2.0
// User objects, as code that ties a resource's life to a CUDA graph's uses
// them: a graph captured once owns object A (its reference moved from the
// program, which keeps one of its own), its executable graph replays every
// step, and A's destructor runs only when the last of the program, the graph
// and the executable graph lets go (steps 3, 5 and 8). Object B is the
// program's alone, released at step 6. Each step prints the replayed
// buffer's checksum and which destructors have run (each with the step it
// ran in), so that a destructor run too early or never shows in the output.
//   user_objects [--steps N] [--sleep-ms MS] [--child]
// --child: the graph also becomes a child graph node of a second graph, which
// then holds references to A that a checkpoint cannot follow.
#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common.h"

constexpr int kN = 4096;

__global__ void bump(unsigned* a, int n, unsigned k) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) a[i] = a[i] * 2654435761u + k + static_cast<unsigned>(i);
}

struct Tracked {
  const char* name;
  std::atomic<int> destroyedAt{-1};
};
std::atomic<int> gStep{0};

void destroyed(void* p) {
  static_cast<Tracked*>(p)->destroyedAt = gStep.load();
}

// Waits (up to 5 s) for `t`'s destructor, which runs apart from the call that
// dropped the last reference.
void awaitDestructor(const Tracked& t) {
  for (int i = 0; i < 500 && t.destroyedAt.load() < 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

int main(int argc, char** argv) {
  int steps = 10, sleepMs = 0;
  bool child = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--child") == 0) child = true;
    if (i + 1 >= argc) continue;
    if (std::strcmp(argv[i], "--steps") == 0) steps = std::stoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--sleep-ms") == 0) sleepMs = std::stoi(argv[i + 1]);
  }
  static Tracked a{"A"}, b{"B"};
  unsigned* buffer = nullptr;
  CHECK(cudaMalloc(&buffer, kN * sizeof(unsigned)));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // On `stream`, not the legacy stream: a non-blocking stream does not wait
  // for the legacy stream, so a cudaMemset there would race the first replay.
  CHECK(cudaMemsetAsync(buffer, 0, kN * sizeof(unsigned), stream));

  cudaUserObject_t objectA, objectB;
  CHECK(cudaUserObjectCreate(&objectA, &a, destroyed, 2, cudaUserObjectNoDestructorSync));
  CHECK(cudaUserObjectCreate(&objectB, &b, destroyed, 1, cudaUserObjectNoDestructorSync));
  cudaGraph_t graph;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  bump<<<kN / 256, 256, 0, stream>>>(buffer, kN, 7);
  bump<<<kN / 256, 256, 0, stream>>>(buffer, kN, 11);
  CHECK(cudaStreamEndCapture(stream, &graph));
  CHECK(cudaGraphRetainUserObject(graph, objectA, 1,
                                  cudaGraphUserObjectMove));  // the program keeps 1
  CHECK(cudaGraphRetainUserObject(graph, objectA, 2, 0));     // the graph holds 3
  CHECK(cudaGraphReleaseUserObject(graph, objectA, 1));       // ... and then 2
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaGraph_t outer = nullptr;
  if (child) {
    cudaGraphNode_t node;
    CHECK(cudaGraphCreate(&outer, 0));
    CHECK(cudaGraphAddChildGraphNode(&node, outer, nullptr, 0, graph));
  }
  bool graphAlive = true, execAlive = true;

  std::vector<unsigned> host(kN);
  for (int s = 0; s < steps; ++s) {
    gStep = s;
    if (execAlive) CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaStreamSynchronize(stream));
    if (s == 3) {
      CHECK(cudaUserObjectRelease(objectA, 1));  // the graph and its executable graph hold it
    }
    if (s == 5 && graphAlive) {
      CHECK(cudaGraphDestroy(graph));  // the executable graph holds it
      graphAlive = false;
    }
    if (s == 6) {
      CHECK(cudaUserObjectRelease(objectB, 1));
      awaitDestructor(b);
    }
    if (s == 8 && execAlive) {
      CHECK(cudaGraphExecDestroy(exec));
      execAlive = false;
      awaitDestructor(a);
    }
    // A destructor that runs too early has had time to show.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK(cudaMemcpy(host.data(), buffer, kN * sizeof(unsigned), cudaMemcpyDeviceToHost));
    std::printf("step %d buffer %016llx A destroyed at %d B destroyed at %d\n", s,
                checksum(host.data(), kN * sizeof(unsigned)), a.destroyedAt.load(),
                b.destroyedAt.load());
    std::fflush(stdout);
    if (sleepMs > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleepMs));
  }
  if (execAlive) CHECK(cudaGraphExecDestroy(exec));
  if (graphAlive) CHECK(cudaGraphDestroy(graph));
  if (outer != nullptr) CHECK(cudaGraphDestroy(outer));
  CHECK(cudaStreamDestroy(stream));
  CHECK(cudaFree(buffer));
  // (The child graph node's clone keeps A until the second graph goes, at the end.)
  const bool ok = steps < 9 || ((child || a.destroyedAt.load() == 8) && b.destroyedAt.load() == 6);
  std::printf("user_objects %s\n", ok ? "OK" : "WRONG: a destructor ran at the wrong step");
  return ok ? 0 : 1;
}
