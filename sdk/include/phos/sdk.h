/* SPDX-License-Identifier: Apache-2.0 */
/* The PhOS application SDK: ask for an asynchronous checkpoint of this process
 * at a point the application chooses (the start of an iteration, say), in one
 * line:
 *
 *     #include <phos/sdk.h>
 *     phos_checkpoint("/ckpt/step-1000", "cow");
 *
 * Header only: nothing to link. Under PhOS (phos run, or LD_PRELOAD=libphos.so)
 * the call hands the request to `phos checkpoint --leave-running` and returns at
 * once; the process runs on while it is saved (soft copy-on-write: the image is
 * the state at about this call; "recopy": the state when the copy ends; "stop":
 * its GPU calls wait for the copy; NULL: "cow"). What the checkpoint did,
 * its JSON report or its error, goes to IMAGE.log next to the image.
 *
 * Returns 0 when the request was handed over; otherwise -1 with errno:
 * ENOSYS when the process does not run under PhOS, EINVAL for a NULL or empty
 * image path or an unknown mode, EEXIST when the image already exists, or what
 * starting `phos checkpoint` failed with. C and C++. */
#ifndef PHOS_SDK_H
#define PHOS_SDK_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1 /* RTLD_DEFAULT */
#endif
#include <dlfcn.h>
#include <errno.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Exported by libphos.so; looked up at run time so that the application runs
 * unchanged without PhOS. */
typedef int (*phos_sdk_checkpoint_fn)(const char* image, const char* mode);

static inline int phos_checkpoint(const char* image, const char* mode) {
  phos_sdk_checkpoint_fn fn = (phos_sdk_checkpoint_fn)dlsym(RTLD_DEFAULT, "phos_sdk_checkpoint");
  if (fn == 0) {
    errno = ENOSYS;
    return -1;
  }
  return fn(image, mode);
}

#ifdef __cplusplus
}
#endif

#endif /* PHOS_SDK_H */
