/* MindSpore AOT custom-op adapters over libhyper_parallel_kernels (hyper_parallel_cpp.mindspore).
 *
 * MindSpore calls an AOT function as int F(nparam, params, ndims, shapes, dtypes, stream, extra):
 * the inputs, then the outputs, as raw buffers. Only the int comes back, so the message of a
 * failure is kept here (hpms_last_error) and on stderr; Python reads it through ctypes. Plain C:
 * MindSpore uses the old C++ ABI and LibTorch the new one, and nothing C++ crosses either.
 *
 * Every op takes the same `options` input, float64 [HPMS_OPTIONS] (see hpms_option below), so
 * one MindSpore Cell holds them as a tensor. The statistics travel as a packet per rank,
 * [HPMS_HEADER + HPK_STATS * rows] values: a header (status, this rank's class range, the
 * message of a failed check) and then hpk_cross_entropy_stats's output. The packet is float32
 * whatever the compute type: MindSpore's CPU collectives carry float32 only (measured, MindSpore
 * 2.10 with mccl: AllGather rounds float64 and int64 to float32, AllReduce accepts float32 and
 * float16 only). A float64 value travels as HPMS_PARTS float32s, exactly (encode_float64). A check that
 * fails on one rank still sends its packet, so every rank's combine sees it and fails with the
 * same message: no rank is left waiting in the all-gather. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyper_parallel_kernels/loss_kernels.h"

#define HPMS_API __attribute__((visibility("default")))

enum hpms_option {
  HPMS_OPT_IGNORE_INDEX = 0,
  HPMS_OPT_REDUCTION = 1,
  HPMS_OPT_LABEL_SMOOTHING = 2,
  HPMS_OPT_CLASS_OFFSET = 3,
  HPMS_OPT_LOCAL_CLASSES = 4,
  HPMS_OPT_TOTAL_CLASSES = 5,
  HPMS_OPT_TARGET_KIND = 6,
  HPMS_OPT_HAS_WEIGHT = 7,
  HPMS_OPTIONS = 8
};

/* Packet header: status, class_offset, local_classes, total_classes, rows, then the message. */
enum { HPMS_HEAD_VALUES = 5, HPMS_HEADER = HPMS_HEAD_VALUES + HPK_MESSAGE_SIZE };

/* Room for a kernel's message plus the rank that found it. */
enum { HPMS_MESSAGE_SIZE = 2 * HPK_MESSAGE_SIZE };

static pthread_mutex_t last_error_lock = PTHREAD_MUTEX_INITIALIZER;
static int32_t last_error_code = 0;
static char last_error_message[HPMS_MESSAGE_SIZE] = "";

/* The last failure of any op of this library in this process (MindSpore may run kernels on its
 * own threads, so this is process-wide, not thread-local). */
HPMS_API int32_t hpms_last_error(char* message, int64_t size) {
  pthread_mutex_lock(&last_error_lock);
  int32_t code = last_error_code;
  if (message != NULL && size > 0) {
    strncpy(message, last_error_message, (size_t)size - 1);
    message[size - 1] = '\0';
  }
  pthread_mutex_unlock(&last_error_lock);
  return code;
}

HPMS_API void hpms_clear_error(void) {
  pthread_mutex_lock(&last_error_lock);
  last_error_code = 0;
  last_error_message[0] = '\0';
  pthread_mutex_unlock(&last_error_lock);
}

HPMS_API int32_t hpms_header_size(void) { return HPMS_HEADER; }

static int fail(int32_t code, const char* message) {
  pthread_mutex_lock(&last_error_lock);
  last_error_code = code;
  snprintf(last_error_message, sizeof last_error_message, "%s", message);
  pthread_mutex_unlock(&last_error_lock);
  fprintf(stderr, "hyper_parallel_cpp.mindspore: %s\n", message);
  return code;
}

static int32_t dtype_of(const char* name) {
  if (strcmp(name, "float32") == 0) return HPK_FLOAT32;
  if (strcmp(name, "float16") == 0) return HPK_FLOAT16;
  if (strcmp(name, "bfloat16") == 0) return HPK_BFLOAT16;
  if (strcmp(name, "float64") == 0) return HPK_FLOAT64;
  if (strcmp(name, "int32") == 0) return HPK_INT32;
  if (strcmp(name, "int64") == 0) return HPK_INT64;
  return -1;
}

/* float32s per packet value: 1 for float32 compute; 4 for float64 (encode_float64). */
enum { HPMS_PARTS = 4 };
static int64_t parts_of(int32_t compute) { return compute == HPK_FLOAT64 ? HPMS_PARTS : 1; }

/* A double as four float32s, exactly: x = (hi + mid + lo) * 2^exponent with hi + mid + lo the
 * frexp mantissa in [0.5, 1) (24 + 24 + 24 bits >= float64's 53), the exponent an integer.
 * Non-finite values travel in hi alone. Adding zeros (the AllReduce of per-rank slots) keeps
 * every part as it is. */
static void encode_float64(double x, float* out) {
  if (!isfinite(x) || x == 0.0) {
    out[0] = (float)x;
    out[1] = out[2] = out[3] = 0.0f;
    return;
  }
  int exponent = 0;
  double m = frexp(x, &exponent);
  float hi = (float)m;
  double rest = m - (double)hi;
  float mid = (float)rest;
  out[0] = hi;
  out[1] = mid;
  out[2] = (float)(rest - (double)mid);
  out[3] = (float)exponent;
}
static double decode_float64(const float* in) {
  if (!isfinite(in[0]) || in[0] == 0.0f) return (double)in[0];
  return ldexp((double)in[0] + (double)in[1] + (double)in[2], (int)in[3]);
}

static int64_t elements(int ndim, const int64_t* shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

/* Value i of a float32 packet of the compute type. */
static double packet_get(const float* packet, int32_t compute, int64_t i) {
  return compute == HPK_FLOAT64 ? decode_float64(packet + HPMS_PARTS * i) : (double)packet[i];
}
static void packet_set(float* packet, int32_t compute, int64_t i, double v) {
  if (compute == HPK_FLOAT64)
    encode_float64(v, packet + HPMS_PARTS * i);
  else
    packet[i] = (float)v;
}

/* The cross-entropy description from the op's inputs: logits (or NULL), target, weight, options. */
static int describe(hpk_cross_entropy* ce, const void* logits, int32_t logits_dtype, int64_t rows, void** params,
                    int* ndims, int64_t** shapes, const char** dtypes, int target_at) {
  const double* options = (const double*)params[target_at + 2];
  if (strcmp(dtypes[target_at + 2], "float64") != 0 ||
      elements(ndims[target_at + 2], shapes[target_at + 2]) != HPMS_OPTIONS)
    return fail(HPK_ERROR_INTERNAL, "internal: the options input must be float64 [8]");
  hpk_cross_entropy_init(ce);
  ce->logits.dtype = logits_dtype;
  ce->logits.data = logits;
  ce->logits.rows = rows;
  ce->logits.local_classes = (int64_t)options[HPMS_OPT_LOCAL_CLASSES];
  ce->logits.class_offset = (int64_t)options[HPMS_OPT_CLASS_OFFSET];
  ce->logits.total_classes = (int64_t)options[HPMS_OPT_TOTAL_CLASSES];
  ce->target_kind = (int32_t)options[HPMS_OPT_TARGET_KIND];
  ce->target_dtype = dtype_of(dtypes[target_at]);
  ce->target = params[target_at];
  if (options[HPMS_OPT_HAS_WEIGHT] != 0.0) {
    ce->weight = params[target_at + 1];
    ce->weight_dtype = dtype_of(dtypes[target_at + 1]);
    ce->weight_length = elements(ndims[target_at + 1], shapes[target_at + 1]);
  }
  ce->ignore_index = (int64_t)options[HPMS_OPT_IGNORE_INDEX];
  ce->reduction = (int32_t)options[HPMS_OPT_REDUCTION];
  ce->label_smoothing = options[HPMS_OPT_LABEL_SMOOTHING];
  return 0;
}

/* inputs: logits [rows, local_classes], target, weight, options; output: the float32 packet. Check
 * failures go into the packet (return 0) so that every rank learns of them after the gather. */
HPMS_API int hpms_cross_entropy_stats(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes,
                                      void* stream, void* extra) {
  (void)stream;
  (void)extra;
  if (nparam != 5) return fail(HPK_ERROR_INTERNAL, "internal: hpms_cross_entropy_stats takes 4 inputs and 1 output");
  int32_t logits_dtype = dtype_of(dtypes[0]);
  int64_t rows = ndims[0] == 2 ? shapes[0][0] : 0;
  hpk_cross_entropy ce;
  int status = describe(&ce, params[0], logits_dtype, rows, params, ndims, shapes, dtypes, 1);
  if (status != 0) return status;
  int32_t compute = hpk_compute_dtype(logits_dtype);
  float* packet = (float*)params[4];
  if (compute < 0 || strcmp(dtypes[4], "float32") != 0 ||
      elements(ndims[4], shapes[4]) != (HPMS_HEADER + (int64_t)HPK_STATS * rows) * parts_of(compute))
    return fail(HPK_ERROR_INTERNAL, "internal: the statistics packet's dtype or size does not match the logits");
  /* float32 statistics go straight into the packet; float64 ones through a buffer. */
  double* wide = NULL;
  if (compute == HPK_FLOAT64) {
    wide = (double*)malloc((size_t)(HPK_STATS * (rows > 0 ? rows : 1)) * sizeof(double));
    if (wide == NULL) return fail(HPK_ERROR_INTERNAL, "out of memory for the statistics");
  }
  hpk_error error = {0, ""};
  status = hpk_cross_entropy_stats(&ce, wide != NULL ? (void*)wide : (void*)(packet + HPMS_HEADER), &error);
  double head[HPMS_HEAD_VALUES] = {(double)status, (double)ce.logits.class_offset, (double)ce.logits.local_classes,
                                   (double)ce.logits.total_classes, (double)rows};
  for (int i = 0; i < HPMS_HEAD_VALUES; ++i) packet_set(packet, compute, i, head[i]);
  for (int i = 0; i < HPK_MESSAGE_SIZE; ++i)
    packet_set(packet, compute, HPMS_HEAD_VALUES + i, status != 0 ? (double)(unsigned char)error.message[i] : 0.0);
  /* After a failed check the statistics are zeros, never read (combine refuses first). */
  if (wide != NULL) {
    for (int64_t i = 0; i < HPK_STATS * rows; ++i)
      packet_set(packet, compute, HPMS_HEADER + i, status != 0 ? 0.0 : wide[i]);
    free(wide);
  } else if (status != 0) {
    memset(packet + HPMS_HEADER, 0, (size_t)(HPK_STATS * rows) * sizeof(float));
  }
  return 0;
}

/* The first failed rank's check, ranks that disagree on the classes or the rows, or pieces that
 * do not tile [0, total_classes): the same error on every rank. */
static int check_packets(const float* packets, int32_t compute, int64_t ranks, int64_t stride) {
  char message[HPMS_MESSAGE_SIZE];
  for (int64_t r = 0; r < ranks; ++r) {
    const float* p = packets + r * stride;
    int32_t status = (int32_t)packet_get(p, compute, 0);
    if (status != 0) {
      char text[HPK_MESSAGE_SIZE];
      for (int i = 0; i < HPK_MESSAGE_SIZE; ++i) text[i] = (char)(int)packet_get(p, compute, HPMS_HEAD_VALUES + i);
      text[HPK_MESSAGE_SIZE - 1] = '\0';
      snprintf(message, sizeof message, "%s (found on rank %lld of the group)", text, (long long)r);
      return fail(status, message);
    }
  }
  int64_t total = (int64_t)packet_get(packets, compute, 3), rows = (int64_t)packet_get(packets, compute, 4);
  int64_t covered = 0, misplaced = -1;
  for (int64_t r = 0; r < ranks; ++r) {
    const float* p = packets + r * stride;
    if ((int64_t)packet_get(p, compute, 3) != total || (int64_t)packet_get(p, compute, 4) != rows) {
      snprintf(message, sizeof message,
               "the ranks disagree on the classes or the rows: rank 0 has %lld classes and %lld rows, rank %lld has "
               "%lld and %lld (without vocab_size the pieces are taken as even: uneven pieces need vocab_size)",
               (long long)total, (long long)rows, (long long)r, (long long)packet_get(p, compute, 3),
               (long long)packet_get(p, compute, 4));
      return fail(HPK_ERROR_SHAPE, message);
    }
    /* In rank order each piece starts where the pieces below it end. */
    if (misplaced < 0 && (int64_t)packet_get(p, compute, 1) != covered) misplaced = r;
    covered += (int64_t)packet_get(p, compute, 2);
  }
  if (misplaced >= 0 || covered != total) {
    char where[64] = "";
    if (misplaced >= 0) snprintf(where, sizeof where, ", the first misplaced piece on rank %lld", (long long)misplaced);
    snprintf(message, sizeof message,
             "the ranks' class pieces do not tile the %lld classes: contiguous pieces in rank order from class 0 "
             "expected, found %lld classes in all%s; uneven pieces need vocab_size",
             (long long)total, (long long)covered, where);
    return fail(HPK_ERROR_SHAPE, message);
  }
  return 0;
}

/* inputs: packets [ranks, packet], target, weight, options; outputs: the loss ([rows] for
 * reduction none, else [1]) and saved [HPK_CE_SAVED, rows], in the compute type. */
HPMS_API int hpms_cross_entropy_combine(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes,
                                        void* stream, void* extra) {
  (void)stream;
  (void)extra;
  if (nparam != 6 || ndims[0] != 2 || strcmp(dtypes[0], "float32") != 0)
    return fail(HPK_ERROR_INTERNAL, "internal: hpms_cross_entropy_combine takes 4 inputs (float32 packets), 2 outputs");
  int32_t compute = dtype_of(dtypes[4]);
  if (compute != HPK_FLOAT32 && compute != HPK_FLOAT64)
    return fail(HPK_ERROR_INTERNAL, "internal: the combined output must be float32 or float64");
  const float* packets = (const float*)params[0];
  int64_t ranks = shapes[0][0], stride = shapes[0][1];
  int64_t rows = (stride / parts_of(compute) - HPMS_HEADER) / HPK_STATS;
  int status = check_packets(packets, compute, ranks, stride);
  if (status != 0) return status;
  /* The kernels' dtype rule: float64 logits compute in float64, the others in float32. */
  hpk_cross_entropy ce;
  status = describe(&ce, NULL, compute, rows, params, ndims, shapes, dtypes, 1);
  if (status != 0) return status;
  int64_t scale = hpk_dtype_size(compute);
  char* all_stats = (char*)malloc((size_t)(ranks * HPK_STATS * (rows > 0 ? rows : 1) * scale));
  if (all_stats == NULL) return fail(HPK_ERROR_INTERNAL, "out of memory gathering the statistics");
  for (int64_t r = 0; r < ranks; ++r) {
    for (int64_t i = 0; i < HPK_STATS * rows; ++i) {
      double v = packet_get(packets + r * stride, compute, HPMS_HEADER + i);
      if (compute == HPK_FLOAT64)
        ((double*)all_stats)[r * HPK_STATS * rows + i] = v;
      else
        ((float*)all_stats)[r * HPK_STATS * rows + i] = (float)v;
    }
  }
  hpk_error error = {0, ""};
  status = hpk_cross_entropy_combine(&ce, all_stats, ranks, params[4], params[5], &error);
  free(all_stats);
  return status != 0 ? fail(status, error.message) : 0;
}

/* inputs: logits, target, weight, options, saved, the loss's gradient; output: grad_logits. */
HPMS_API int hpms_cross_entropy_backward(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes,
                                         void* stream, void* extra) {
  (void)stream;
  (void)extra;
  if (nparam != 7) return fail(HPK_ERROR_INTERNAL, "internal: hpms_cross_entropy_backward takes 6 inputs and 1 output");
  int64_t rows = ndims[0] == 2 ? shapes[0][0] : 0;
  hpk_cross_entropy ce;
  int status = describe(&ce, params[0], dtype_of(dtypes[0]), rows, params, ndims, shapes, dtypes, 1);
  if (status != 0) return status;
  hpk_error error = {0, ""};
  status = hpk_cross_entropy_backward(&ce, params[4], params[5], params[6], 0, &error);
  return status != 0 ? fail(status, error.message) : 0;
}

/* One name per output shape rule: MindSpore (2.10, PyNative) keeps the shape function of the
 * first ops.Custom it meets for a given "lib:function", so ops whose outputs are shaped
 * differently (float32 / float64 packets; a loss of [rows] / [1]) must have names of their own. */
#define HPMS_ALIAS(alias, target)                                                                                \
  HPMS_API int alias(int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes, void* stream, \
                     void* extra) {                                                                              \
    return target(nparam, params, ndims, shapes, dtypes, stream, extra);                                         \
  }
HPMS_ALIAS(hpms_cross_entropy_stats_float32, hpms_cross_entropy_stats)
HPMS_ALIAS(hpms_cross_entropy_stats_float64, hpms_cross_entropy_stats)
HPMS_ALIAS(hpms_cross_entropy_combine_float32_none, hpms_cross_entropy_combine)
HPMS_ALIAS(hpms_cross_entropy_combine_float32_reduced, hpms_cross_entropy_combine)
HPMS_ALIAS(hpms_cross_entropy_combine_float64_none, hpms_cross_entropy_combine)
HPMS_ALIAS(hpms_cross_entropy_combine_float64_reduced, hpms_cross_entropy_combine)
