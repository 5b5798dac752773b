/* C interface of libhexlora_skel.so (see hexlora.idl).
 *
 * Rust mirrors: dsp/src/skel/abi.rs (remote_arg, scalars, AEE codes) and
 * dsp/src/skel/mod.rs (methods, response layout). CI runs bindgen on this
 * header and checks the two agree (ci/bindgen-check.sh).
 *
 * Built against the Hexagon SDK (HEXLORA_HAVE_REMOTE_H), the FastRPC types
 * come from remote.h; otherwise the subset below, identical in layout.
 */
#ifndef HEXLORA_H
#define HEXLORA_H

#include <stddef.h>
#include <stdint.h>

#ifdef HEXLORA_HAVE_REMOTE_H
#include "remote.h"
#else
typedef uint64_t remote_handle64;
typedef uint32_t remote_handle;

typedef struct {
    void *pv;
    size_t nLen;
} remote_buf;

typedef struct {
    int32_t fd;
    uint32_t offset;
} remote_dma_handle;

typedef union {
    remote_buf buf;
    remote_handle h;
    remote_handle64 h64;
    remote_dma_handle dma;
} remote_arg;

#define REMOTE_SCALARS_METHOD_ATTR(sc) (((sc) >> 29) & 0x7)
#define REMOTE_SCALARS_METHOD(sc) (((sc) >> 24) & 0x1f)
#define REMOTE_SCALARS_INBUFS(sc) (((sc) >> 16) & 0x0ff)
#define REMOTE_SCALARS_OUTBUFS(sc) (((sc) >> 8) & 0x0ff)
#define REMOTE_SCALARS_INHANDLES(sc) (((sc) >> 4) & 0x0f)
#define REMOTE_SCALARS_OUTHANDLES(sc) ((sc) & 0x0f)
#define REMOTE_SCALARS_MAKEX(attr, method, in, out, in_h, out_h)             \
    ((((uint32_t)(attr) & 0x7) << 29) | (((uint32_t)(method) & 0x1f) << 24) | \
     (((uint32_t)(in) & 0xff) << 16) | (((uint32_t)(out) & 0xff) << 8) |     \
     (((uint32_t)(in_h) & 0x0f) << 4) | ((uint32_t)(out_h) & 0x0f))
#define REMOTE_SCALARS_MAKE(method, in, out) REMOTE_SCALARS_MAKEX(0, method, in, out, 0, 0)
#endif

/* Methods of hexlora_skel_handle_invoke. */
#define HEXLORA_METHOD_OPEN 0
#define HEXLORA_METHOD_CLOSE 1
#define HEXLORA_METHOD_CALL 2

/* Upper bound of one encoded Request or Response (hexlora-proto). */
#define HEXLORA_MAX_MESSAGE_BYTES 96
/* Bytes of the `response` buffer: u32 length + message. */
#define HEXLORA_RESPONSE_BUF_BYTES (4 + HEXLORA_MAX_MESSAGE_BYTES)

/* Transport status codes returned by the skel (AEEStdErr.h values). */
#define HEXLORA_AEE_SUCCESS 0
#define HEXLORA_AEE_ENOMEMORY 2
#define HEXLORA_AEE_EBADPARM 14
#define HEXLORA_AEE_EUNSUPPORTED 20

#ifdef __cplusplus
extern "C" {
#endif

/* FastRPC entry point of the skel: method in `scalars`, buffers in `args`. */
int hexlora_skel_handle_invoke(remote_handle64 handle, uint32_t scalars, remote_arg *args);

/* The interface implementation the skel exports alongside (qaic names). */
int hexlora_open(const char *uri, remote_handle64 *handle);
int hexlora_close(remote_handle64 handle);

#ifdef __cplusplus
}
#endif

#endif /* HEXLORA_H */
