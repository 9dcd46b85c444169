/* HyperParallel's fused vocabulary-parallel cross-entropy and log-probabilities as a plain C
 * interface: raw pointers in, an int status and a message out, no C++ type across it. For
 * frameworks that cannot take a LibTorch extension (MindSpore's AOT custom ops: MindSpore is
 * built with the old C++ ABI, LibTorch with the new), and for anyone who gathers the
 * statistics with their own collectives.
 *
 * Library: libhyper_parallel_kernels.so. It needs no LibTorch at run time (only libc, libm,
 * libstdc++ and the OpenMP runtime); it is compiled from the same kernel source as
 * libhyper_parallel's CPU kernels (src/loss/kernel/), per CPU capability, chosen at run time.
 * Where it lies: <prefix>/lib after `cmake --install`; in the Python package next to
 * __init__.py (hyper_parallel_cpp/libhyper_parallel_kernels.so, also in a build tree's
 * build/python/hyper_parallel_cpp/).
 *
 * The algorithm, for logits whose classes are cut into pieces across P ranks (this rank holds
 * classes [class_offset, class_offset + local_classes) of total_classes):
 *   1. *_stats:   per-row statistics of this rank's classes, [HPK_STATS, rows]. No collective.
 *   2. the caller's framework gathers every rank's statistics: [P, HPK_STATS, rows] (one
 *      all-gather; the order of the ranks does not matter).
 *   3. *_combine: the loss (or log-probabilities) from them, the same on every rank, and what
 *      backward needs, `saved`. No collective.
 *   4. *_backward: the gradient of this rank's logits from `saved` and the incoming gradient.
 *      No collective.
 * With P = 1 (class_offset 0, local_classes = total_classes) it is the one-process loss.
 *
 * Arrays: row-major; logits [rows, local_classes] with a row stride (in elements; 0 means
 * local_classes) and unit class stride. "Compute type": float32 for float32, float16 and
 * bfloat16 logits, float64 for float64 logits (hpk_compute_dtype); statistics, saved values,
 * losses, log-probabilities and incoming gradients are in it. Gradients are in the logits'
 * dtype and may be written over the logits (grad_logits == logits, same row stride).
 *
 * Errors: every function returns 0 (HPK_OK) or an hpk_status code, and when `error` is not
 * NULL fills it with the code and a message naming what was expected and what was found.
 * Nothing is written to the outputs on an error. No C++ exception leaves the library. The
 * checks depend only on what every rank holds alike (dtype, shapes, targets, weights,
 * options), so a bad input fails with the same code and message on every rank, before the
 * gather when it is found in *_stats.
 *
 * Threads: rows are split across OpenMP threads (OMP_NUM_THREADS, or hpk_set_num_threads).
 * Every function is reentrant. */
#ifndef HYPER_PARALLEL_KERNELS_LOSS_KERNELS_H_
#define HYPER_PARALLEL_KERNELS_LOSS_KERNELS_H_

#include <stdint.h>

#if defined(HPK_BUILDING_LIBRARY)
#define HPK_API __attribute__((visibility("default")))
#else
#define HPK_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Constants ------------------------------------------------------------------------ */

/* Data types (values fixed: they cross process and language boundaries). */
typedef enum hpk_dtype {
  HPK_FLOAT32 = 0,
  HPK_FLOAT16 = 1,
  HPK_BFLOAT16 = 2,
  HPK_FLOAT64 = 3,
  HPK_INT32 = 4, /* index targets only */
  HPK_INT64 = 5  /* index targets only */
} hpk_dtype;

/* PyTorch's reductions, with PyTorch's values (at::Reduction). */
typedef enum hpk_reduction { HPK_REDUCTION_NONE = 0, HPK_REDUCTION_MEAN = 1, HPK_REDUCTION_SUM = 2 } hpk_reduction;

typedef enum hpk_target_kind {
  HPK_TARGET_INDEX = 0,        /* [rows] global class ids (INT32 or INT64) */
  HPK_TARGET_PROBABILITIES = 1 /* [rows, local_classes]: this rank's classes (a floating dtype) */
} hpk_target_kind;

enum {
  HPK_STATS = 5,          /* statistics per row (the leading dimension of a stats array) */
  HPK_CE_SAVED = 6,       /* cross-entropy saved values per row: row_max, log_sum, a, b, c, t */
  HPK_LOGPROBS_SAVED = 3, /* log-probabilities saved values per row: row_max, log_sum, mean_difference */
  HPK_MESSAGE_SIZE = 512
};

/* Status codes (0 is success). */
typedef enum hpk_status {
  HPK_OK = 0,
  HPK_ERROR_NULL_POINTER = 1, /* a required pointer is NULL (or an optional one given where it is not allowed) */
  HPK_ERROR_DTYPE = 2,        /* an unsupported dtype for that argument */
  HPK_ERROR_SHAPE = 3,        /* a size, stride, offset or rank count out of range or inconsistent */
  HPK_ERROR_TARGET = 4,       /* an index target outside [0, total_classes) that is not ignore_index */
  HPK_ERROR_WEIGHT = 5,       /* class weights of the wrong length */
  HPK_ERROR_OPTION = 6,       /* an option out of range (reduction, label_smoothing, z_loss_weight, ...) */
  HPK_ERROR_INTERNAL = 7,     /* anything else (an exception inside the library, out of memory) */
  HPK_ERROR_LAYOUT = 8,     /* hpk_resolve_class_axis: a layout loss_parallel does not take (LossParallelLayoutError) */
  HPK_ERROR_UNSUPPORTED = 9 /* hpk_resolve_class_axis: a layout the route cannot take (LossParallelUnsupportedError) */
} hpk_status;

/* The error channel: the code and a NUL-terminated message (truncated to fit). */
typedef struct hpk_error {
  int32_t code;
  char message[HPK_MESSAGE_SIZE];
} hpk_error;

/* ---- Inputs ----------------------------------------------------------------------------- */

/* This rank's piece of the logits. */
typedef struct hpk_logits {
  int32_t dtype;         /* HPK_FLOAT32, HPK_FLOAT16, HPK_BFLOAT16 or HPK_FLOAT64 */
  const void* data;      /* [rows, local_classes]; may be NULL in *_combine (not read there) */
  int64_t rows;          /* >= 0 */
  int64_t local_classes; /* >= 0 (0: a rank without classes, more ranks than classes) */
  int64_t row_stride;    /* elements between rows; 0: local_classes; else >= local_classes */
  int64_t class_offset;  /* global id of this rank's first class, >= 0 */
  int64_t total_classes; /* C, over all ranks; class_offset + local_classes <= C */
} hpk_logits;

/* A cross-entropy: PyTorch's F.cross_entropy arguments plus z-loss and logit soft-capping.
 * Initialise with hpk_cross_entropy_init, then set what differs. */
typedef struct hpk_cross_entropy {
  hpk_logits logits;
  int32_t target_kind;       /* hpk_target_kind */
  int32_t target_dtype;      /* index: HPK_INT32 / HPK_INT64; probabilities: a floating dtype */
  const void* target;        /* index: [rows] global ids; probabilities: [rows, local_classes] */
  int64_t target_row_stride; /* probabilities only: elements between rows; 0: local_classes */
  const void* weight;        /* class weights [weight_length], or NULL (all 1) */
  int32_t weight_dtype;      /* a floating dtype; converted to the compute type */
  int64_t weight_length;     /* must equal logits.total_classes when weight is given */
  int64_t ignore_index;      /* index targets equal to it count for nothing (-100); probability
                                targets: must be negative (PyTorch's rule) */
  int32_t reduction;         /* hpk_reduction (HPK_REDUCTION_MEAN) */
  double label_smoothing;    /* in [0, 1] (0) */
  double z_loss_weight;      /* >= 0: + z * lse^2 per counted row, not weighted; mean divides it
                                by the number of counted rows (0) */
  double logit_softcap;      /* >= 0; > 0: every logit x becomes cap * tanh(x / cap) first (0) */
} hpk_cross_entropy;

/* Log-probabilities of sampled tokens and the entropy, at a temperature: log p_t and
 * H = -sum_c p_c log p_c for p = softmax(logits / T). Ignored rows give 0. */
typedef struct hpk_logprobs {
  hpk_logits logits;
  int32_t target_dtype; /* HPK_INT32 or HPK_INT64 */
  const void* target;   /* [rows] global ids in [0, total_classes), or ignore_index */
  int64_t ignore_index; /* (-100) */
  double temperature;   /* finite, > 0, with 1 / T finite in the compute type (1) */
  int32_t entropy;      /* nonzero: also the entropy (0) */
} hpk_logprobs;

/* ---- Library ---------------------------------------------------------------------------- */

/* "MAJOR.MINOR.PATCH" of the library (the HyperParallel C++ version). */
HPK_API const char* hpk_version(void);
/* The CPU kernel variant that runs here: "DEFAULT", "AVX2", "AVX512" or "AVX512_BF16"
 * (the best this CPU supports; ATEN_CPU_CAPABILITY=default/avx2/avx512 lowers it). */
HPK_API const char* hpk_capability(void);
/* The compute type of logits of `dtype` (HPK_FLOAT32 or HPK_FLOAT64), or -1 for a dtype
 * that is not a logits dtype. */
HPK_API int32_t hpk_compute_dtype(int32_t dtype);
/* Bytes per element of `dtype`, or 0 for an unknown one. */
HPK_API int64_t hpk_dtype_size(int32_t dtype);
/* The OpenMP threads the kernels use from now on, in every thread of the process (>= 1; 0: OpenMP's
 * own again, OMP_NUM_THREADS or the cores); returns the status. */
HPK_API int32_t hpk_set_num_threads(int32_t threads, hpk_error* error);

/* ---- Cross-entropy ---------------------------------------------------------------------- */

/* Defaults: as PyTorch's F.cross_entropy (index targets of HPK_INT64, ignore_index -100,
 * reduction mean, no smoothing, no weights), no z-loss, no soft-cap; logits float32, 0 rows. */
HPK_API void hpk_cross_entropy_init(hpk_cross_entropy* ce);

/* Step 1: this rank's statistics, stats [HPK_STATS, rows] in the compute type. Checks
 * everything the later steps rely on (dtypes, shapes, targets, weights, options). */
HPK_API int32_t hpk_cross_entropy_stats(const hpk_cross_entropy* ce, void* stats, hpk_error* error);

/* Step 3: from every rank's statistics all_stats [ranks, HPK_STATS, rows] (compute type):
 *   loss:  [rows] for reduction none, else [1] (sum, or mean: divided by the summed weights
 *          of the counted rows' targets, as PyTorch; probability targets: by rows), compute type;
 *   saved: [HPK_CE_SAVED, rows], compute type, for hpk_cross_entropy_backward: the row max and
 *          log-sum-exp minus it, and the per-row coefficients of the gradient for a unit
 *          incoming gradient.
 * Reads the targets and weights, not the logits (logits.data may be NULL). */
HPK_API int32_t hpk_cross_entropy_combine(const hpk_cross_entropy* ce, const void* all_stats, int64_t ranks, void* loss,
                                          void* saved, hpk_error* error);

/* Step 4: d loss / d logits of this rank's piece, grad_logits [rows, local_classes] in the
 * logits' dtype with row stride grad_row_stride (0: local_classes), for the incoming
 * gradient grad_loss ([rows] for reduction none, else [1]; compute type). May write over
 * the logits. */
HPK_API int32_t hpk_cross_entropy_backward(const hpk_cross_entropy* ce, const void* saved, const void* grad_loss,
                                           void* grad_logits, int64_t grad_row_stride, hpk_error* error);

/* ---- Log-probabilities and entropy ------------------------------------------------------ */

/* Defaults: index targets of HPK_INT64, ignore_index -100, temperature 1, no entropy. */
HPK_API void hpk_logprobs_init(hpk_logprobs* lp);

/* Step 1: stats [HPK_STATS, rows], compute type. */
HPK_API int32_t hpk_logprobs_stats(const hpk_logprobs* lp, void* stats, hpk_error* error);

/* Step 3: logprobs [rows]; entropy [rows] when lp->entropy (else it may be NULL); saved
 * [HPK_LOGPROBS_SAVED, rows]; all in the compute type. */
HPK_API int32_t hpk_logprobs_combine(const hpk_logprobs* lp, const void* all_stats, int64_t ranks, void* logprobs,
                                     void* entropy, void* saved, hpk_error* error);

/* Step 4: the gradient of this rank's logits for incoming gradients of the log-probabilities
 * and of the entropy ([rows] each, compute type; NULL for none; an entropy gradient needs a
 * forward with lp->entropy). */
HPK_API int32_t hpk_logprobs_backward(const hpk_logprobs* lp, const void* saved, const void* grad_logprobs,
                                      const void* grad_entropy, void* grad_logits, int64_t grad_row_stride,
                                      hpk_error* error);

/* ---- The class axis of loss_parallel's logits --------------------------------------------
 *
 * Which mesh dim of a DTensor shards its class dim, whether the logits must be re-laid out
 * first, and the placements of a tensor over their rows (the target, a per-row loss); or the
 * error every rank raises, with its message. The one decision of every front end (the C++
 * DTensor route, PyTorch's and HyperParallel's DTensors in Python): the caller describes its
 * tensor's placements and its own words, and acts on the answer. Pure: no collective. */

enum { HPK_MAX_MESH_DIMS = 16 };

typedef enum hpk_placement_kind {
  HPK_PLACEMENT_SHARD = 0, /* exactly a Shard of `dim` (torch.chunk's pieces) */
  HPK_PLACEMENT_REPLICATE = 1,
  HPK_PLACEMENT_PARTIAL = 2,
  HPK_PLACEMENT_OTHER = 3 /* other pieces (a strided shard): gathered where re-laid out */
} hpk_placement_kind;

typedef struct hpk_placement {
  int32_t kind; /* hpk_placement_kind */
  int64_t dim;  /* HPK_PLACEMENT_SHARD: the tensor dim, in [0, ndim) */
} hpk_placement;

typedef enum hpk_strictness {
  HPK_STRICTNESS_UNKNOWN = -1, /* not asked yet: answered HPK_CLASS_AXIS_NEEDS_STRICTNESS where it decides */
  HPK_STRICTNESS_RELAXED = 0,
  HPK_STRICTNESS_STRICT = 1
} hpk_strictness;

typedef struct hpk_class_axis_query {
  int32_t is_dtensor; /* 0: a plain tensor (refused) */
  int64_t mesh_ndim;  /* placements given, in [1, HPK_MAX_MESH_DIMS] for a DTensor */
  hpk_placement placements[HPK_MAX_MESH_DIMS];
  int64_t ndim;             /* the tensor's dims */
  int64_t class_dim;        /* in [0, ndim) */
  int32_t can_relayout;     /* the route re-lays out logits off the contract (not strict) */
  int32_t rows_sharded;     /* the route lays out per-row results sharded along the other mesh dims */
  int32_t strictness;       /* hpk_strictness */
  int32_t has_options_mesh; /* loss_parallel(mesh = ...) given: then options_mesh_fits */
  int32_t options_mesh_fits[HPK_MAX_MESH_DIMS]; /* per mesh dim: that mesh is the whole one or that dim's */
  /* The route's words (NUL-terminated; NULL reads as ""): */
  const char* op;           /* the op: "cross_entropy" */
  const char* tensor;       /* its DTensor: "a DTensor" */
  const char* relax;        /* its "not strict": "strict=False"; "" where it has no strictness */
  const char* found;        /* the layout found; for a plain tensor its shape (or "") */
  const char* options_mesh; /* the mesh given */
} hpk_class_axis_query;

typedef enum hpk_class_axis_outcome {
  HPK_CLASS_AXIS_RESOLVED = 0,
  HPK_CLASS_AXIS_NEEDS_STRICTNESS = 1 /* ask again with strictness known (the caller may agree on it first) */
} hpk_class_axis_outcome;

typedef struct hpk_class_axis {
  int32_t outcome;                       /* hpk_class_axis_outcome */
  int64_t mesh_dim;                      /* the mesh dim sharding the class dim */
  int32_t relayout;                      /* nonzero: re-lay out the logits to `want` first */
  hpk_placement want[HPK_MAX_MESH_DIMS]; /* the contract layout, mesh_ndim of them */
  hpk_placement rows[HPK_MAX_MESH_DIMS]; /* a tensor over the logits' rows, mesh_ndim of them */
  /* The refusal's whole message (HPK_ERROR_LAYOUT / HPK_ERROR_UNSUPPORTED), where the caller
   * gives a buffer: set message and message_capacity; message_length is its length (longer than
   * the capacity: truncated, ask again with more). hpk_error holds it too, truncated. */
  char* message;
  int64_t message_capacity;
  int64_t message_length;
} hpk_class_axis;

/* Returns HPK_OK with `axis` filled (outcome resolved or needs strictness), HPK_ERROR_LAYOUT or
 * HPK_ERROR_UNSUPPORTED with the message (error->message unprefixed: it is the refusal itself),
 * or HPK_ERROR_SHAPE / HPK_ERROR_NULL_POINTER for a malformed query. */
HPK_API int32_t hpk_resolve_class_axis(const hpk_class_axis_query* query, hpk_class_axis* axis, hpk_error* error);

/* reduction 'mean' on logits laid out as the query says (it reads the layout, strictness, op,
 * relax and found): PyTorch's contract takes it on a one-dimensional mesh only. HPK_OK with
 * axis->outcome resolved (taken: on more dims without strict, the exact global mean) or needs
 * strictness (ask again with it), HPK_ERROR_UNSUPPORTED with the message (a mesh of more dims
 * under strict), or HPK_ERROR_SHAPE / HPK_ERROR_NULL_POINTER for a malformed query. Only
 * outcome and the message of `axis` are written. */
HPK_API int32_t hpk_class_axis_mean(const hpk_class_axis_query* query, hpk_class_axis* axis, hpk_error* error);

/* The layout a route takes, in the words of the messages ("<tensor> sharded along its class dim 1
 * on exactly one mesh dim (Shard(1)), its other mesh dims ..."), for a route's own messages:
 * written NUL-terminated into buffer (truncated to capacity); returns its whole length. */
HPK_API int64_t hpk_class_axis_expected(int32_t rows_sharded, const char* tensor, int64_t class_dim, char* buffer,
                                        int64_t capacity);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* HYPER_PARALLEL_KERNELS_LOSS_KERNELS_H_ */
