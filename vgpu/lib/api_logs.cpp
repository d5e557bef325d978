// SPDX-License-Identifier: Apache-2.0
// Entry points: the driver's error log. Every failed vgpu call adds a line
// naming the entry point, the CUresult and why (entry.h); the buffer, the
// callbacks and CUDA_LOG_FILE are export_tables' driver_logs, shared with
// libphos.so.
#include "entry.h"

#include "phos/export_tables/driver_logs.h"

CUresult CUDAAPI cuLogsRegisterCallback(CUlogsCallback callbackFunc, void* userData,
                                        CUlogsCallbackHandle* callback_out) {
  return phos::driver_logs::registerCallback(callbackFunc, userData, callback_out);
}
CUresult CUDAAPI cuLogsUnregisterCallback(CUlogsCallbackHandle callback) {
  return phos::driver_logs::unregisterCallback(callback);
}
CUresult CUDAAPI cuLogsCurrent(CUlogIterator* iterator_out, unsigned int flags) {
  return phos::driver_logs::current(iterator_out, flags);
}
CUresult CUDAAPI cuLogsDumpToFile(CUlogIterator* iterator, const char* pathToFile, unsigned int flags) {
  return phos::driver_logs::dumpToFile(iterator, pathToFile, flags);
}
CUresult CUDAAPI cuLogsDumpToMemory(CUlogIterator* iterator, char* buffer, size_t* size, unsigned int flags) {
  return phos::driver_logs::dumpToMemory(iterator, buffer, size, flags);
}
