// SPDX-License-Identifier: Apache-2.0
// Moving device memory between the device and an image: chunk by chunk
// through two page-locked buffers (ChunkCopier), or all at once into host
// memory that threads then write into the image (StagedWrite).
#pragma once

#include <cuda.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "session/driver_table.h"
#include "phos/common/status.h"
#include "phos/image/reader.h"
#include "phos/image/writer.h"
#include "protocols/progress.h"
#include "session/staging_buffer.h"

namespace phos::daemon {

// Copies between device memory and the image through two page-locked
// buffers: while the driver copies one chunk, the other is checksummed and
// written (or read and decompressed).
class ChunkCopier {
 public:
  ChunkCopier(const DriverTable& driver, size_t chunkBytes)
      : driver_(driver), chunkBytes_(chunkBytes) {}

  // Needs a context current (the buffers are registered portable).
  Status prepare() {
    for (int k = 0; k < 2; ++k) {
      staging_[k] = std::make_unique<StagingBuffer>(driver_, chunkBytes_);
      RETURN_IF_ERROR(staging_[k]->allocate());
      buffers_[k] = staging_[k]->data();
    }
    return Status::ok();
  }

  // Device -> image: `bytes` at `address` into blob `blob`, chunk by chunk.
  Status save(image::ImageWriter& writer, size_t blob, CUdeviceptr address, uint64_t bytes,
              const std::function<void(uint64_t)>& advanced) {
    const uint64_t chunks = (bytes + chunkBytes_ - 1) / chunkBytes_;
    auto length = [&](uint64_t i) {
      return std::min<uint64_t>(chunkBytes_, bytes - i * chunkBytes_);
    };
    auto issue = [&](uint64_t i) {
      return PHOS_DRIVER(driver_, MemcpyDtoHAsync_v2)(buffers_[i % 2], address + i * chunkBytes_,
                                                      length(i), nullptr);
    };
    if (chunks == 0) return Status::ok();
    RETURN_IF_ERROR(driverStatus(issue(0), fmt::format("copying device memory at {:#x}", address)));
    for (uint64_t i = 0; i < chunks; ++i) {
      RETURN_IF_ERROR(
          driverStatus(PHOS_DRIVER(driver_, CtxSynchronize)(), "waiting for a device copy"));
      if (i + 1 < chunks) {
        RETURN_IF_ERROR(
            driverStatus(issue(i + 1), fmt::format("copying device memory at {:#x}", address)));
      }
      RETURN_IF_ERROR(writer.writeChunk(blob, i, {buffers_[i % 2], length(i)}));
      advanced(length(i));
    }
    return Status::ok();
  }

  // Image -> device.
  Status load(const image::ImageReader& reader, size_t blob, CUdeviceptr address,
              const std::function<void(uint64_t)>& advanced) {
    const image::BlobInfo& info = reader.manifest().blobs[blob];
    if (info.chunkBytes > chunkBytes_) {
      return makeError(Code::kDataLoss, "blob {}: chunks of {} bytes, more than {}", info.name,
                       info.chunkBytes, chunkBytes_);
    }
    const uint64_t chunks = info.chunkCount();
    for (uint64_t i = 0; i < chunks; ++i) {
      std::byte* buf = buffers_[i % 2];
      const uint32_t n = info.chunkRawBytes(i);
      // The buffer is free again once the copy issued two chunks ago is done.
      if (i >= 2)
        RETURN_IF_ERROR(
            driverStatus(PHOS_DRIVER(driver_, CtxSynchronize)(), "waiting for a device copy"));
      RETURN_IF_ERROR(reader.readChunk(blob, i, {buf, n}));
      RETURN_IF_ERROR(driverStatus(PHOS_DRIVER(driver_, MemcpyHtoDAsync_v2)(
                                       address + i * uint64_t{info.chunkBytes}, buf, n, nullptr),
                                   fmt::format("copying {} back to {:#x}", info.name, address)));
      advanced(n);
    }
    return driverStatus(PHOS_DRIVER(driver_, CtxSynchronize)(), "waiting for a device copy");
  }

 private:
  const DriverTable& driver_;
  size_t chunkBytes_;
  std::unique_ptr<StagingBuffer> staging_[2];
  std::byte* buffers_[2] = {};  // their memory
};

// Device memory copied into host memory first, at the copy engine's rate, so
// that the application waits only for that; background threads then checksum,
// compress and write the chunks while it runs on (with --leave-running) or
// while CRIU's images are committed.
class StagedWrite {
 public:
  struct Item {
    size_t blob;
    uint64_t offset;  // in the staging memory
    uint64_t bytes;
    uint64_t firstChunk = 0;  // the blob's chunk its first byte is (its bytes start at that chunk)
  };

  // Host memory of `bytes`, its pages faulted in now: done before the session
  // pauses, so the application does not wait for it. In slices: MAP_POPULATE
  // holds the process's mmap lock for the whole population (0.37 s for
  // 1.3 GiB here), and this worker's other threads, which serve the
  // application and run vgpu's kernels, could not map memory meanwhile: a
  // checkpoint of a job with 1 GiB of state held it 0.3 s before its pause.
  static Result<std::unique_ptr<StagedWrite>> reserve(const DriverTable& driver, uint64_t bytes) {
    auto staged = std::unique_ptr<StagedWrite>(new StagedWrite(driver));
    staged->bytes_ = std::max<uint64_t>(bytes, 1);
    void* p =
        mmap(nullptr, staged->bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      return errnoError(errno, fmt::format("cannot stage {} bytes of device memory", bytes));
    staged->data_ = static_cast<std::byte*>(p);
    constexpr uint64_t kSlice = 8u << 20;
    const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    for (uint64_t at = 0; at < staged->bytes_; at += kSlice) {
      const uint64_t n = std::min(kSlice, staged->bytes_ - at);
      if (madvise(staged->data_ + at, n, MADV_POPULATE_WRITE) == 0) continue;
      if (errno != EINVAL) {
        return errnoError(
            errno,
            fmt::format("cannot fault in {} bytes of host memory to stage device memory", bytes));
      }
      // A kernel before 5.14: one write per page.
      for (uint64_t b = 0; b < n; b += page)
        static_cast<volatile std::byte*>(staged->data_)[at + b] = std::byte{0};
    }
    return staged;
  }
  uint64_t capacity() const { return bytes_; }
  // Registers the memory with the driver (in the current context), so that
  // copies into it run at the copy engine's rate; unregistered, they still work.
  void registerMemory() {
    if (!registration_.registered()) registration_.add(data_, bytes_);
  }
  ~StagedWrite() {
    join();
    registration_.release();
    if (data_ != nullptr) munmap(data_, bytes_);
  }
  std::byte* data() const { return data_; }

  // The chunks of `items` are to be written into `writer` (once started).
  void plan(image::ImageWriter& writer, std::vector<Item> items) {
    writer_ = &writer;
    items_ = std::move(items);
    for (const Item& item : items_) {
      for (uint64_t at = 0; at < item.bytes; at += image::kDefaultChunkBytes)
        chunks_.push_back({&item, at});
      total_ += item.bytes;
    }
  }

  // Writes the planned chunks on a thread per core (at most 4); once.
  void start() {
    if (started_ || writer_ == nullptr) return;
    started_ = true;
    const unsigned threads = std::clamp(std::thread::hardware_concurrency(), 1u, 4u);
    for (unsigned t = 0; t < threads; ++t) {
      workers_.emplace_back([this, &writer = *writer_] {
        for (size_t i = next_++; i < chunks_.size() && !failed_.load(); i = next_++) {
          const auto& [item, at] = chunks_[i];
          const uint64_t n = std::min<uint64_t>(image::kDefaultChunkBytes, item->bytes - at);
          Status st =
              writer.writeChunk(item->blob, item->firstChunk + at / image::kDefaultChunkBytes,
                                {data_ + item->offset + at, n});
          if (!st.isOk()) {
            std::lock_guard lock(errorMutex_);
            if (error_.isOk()) error_ = st;
            failed_ = true;
          }
          written_ += n;
        }
      });
    }
  }

  // Stops the writing threads at their next chunk (the checkpoint failed).
  void abandon() {
    failed_ = true;
    join();
  }

  // Waits for the writing threads (started now if they were not); reports
  // {"phase": "write"} progress.
  Status finish(const ProgressFn& progress) {
    start();
    PhaseProgress phase(progress, "write", total_);
    phase.start();
    uint64_t reported = 0;
    while (!workers_.empty() && written_.load() < total_ && !failed_.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      const uint64_t now = written_.load();
      phase.advance(now - reported);
      reported = now;
    }
    join();
    phase.advance(written_.load() - reported);
    std::lock_guard lock(errorMutex_);
    return error_;
  }

 private:
  explicit StagedWrite(const DriverTable& driver) : driver_(driver) {}
  void join() {
    for (auto& w : workers_) w.join();
    workers_.clear();
  }

  const DriverTable& driver_;
  HostRegistration registration_{driver_};
  std::byte* data_ = nullptr;
  uint64_t bytes_ = 0;
  image::ImageWriter* writer_ = nullptr;
  bool started_ = false;
  std::vector<Item> items_;
  std::vector<std::pair<const Item*, uint64_t>> chunks_;
  uint64_t total_ = 0;
  std::atomic<size_t> next_{0};
  std::atomic<uint64_t> written_{0};
  std::atomic<bool> failed_{false};
  std::mutex errorMutex_;
  Status error_ = Status::ok();
  std::vector<std::thread> workers_;
};

// Host memory a checkpoint may use to stage device memory: half of what the
// kernel says is available.
uint64_t stagingBudget();

}  // namespace phos::daemon
