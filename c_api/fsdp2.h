/* fsdp2/c_api/fsdp2.h
 *
 * The stable C ABI of fsdp2: Fully Sharded Data Parallel training (PyTorch's
 * FSDP2) for LibTorch, driven from C and from anything that can call C
 * (the Python and Java bindings are generated from this header by SWIG).
 *
 * Plain C99. Every symbol is prefixed fsdp2_; libfsdp2.so exports nothing
 * else.
 *
 * A training program, one process per rank (see examples/train_c.c):
 *
 *   fsdp2_strategy_options_t so;  fsdp2_strategy_options_init(&so);
 *   fsdp2_strategy_t* s;          fsdp2_strategy_create(&so, &s);
 *   fsdp2_strategy_setup_environment(s);      // torchrun/srun/mpirun env
 *   fsdp2_model_t* m;             fsdp2_model_create("{\"family\":\"gpt\"}", &m);
 *   fsdp2_optimizer_options_t oo; fsdp2_optimizer_options_init(&oo);
 *   fsdp2_strategy_connect(s, m, &oo);
 *   fsdp2_strategy_parallelize(s);            // shard, build the optimizer
 *   for (...) fsdp2_strategy_training_step(s, batch, 2, i, NULL, &result);
 *   fsdp2_strategy_save_checkpoint(s, "ckpt");
 *   fsdp2_model_destroy(m); fsdp2_strategy_destroy(s);
 *
 * Conventions (every function follows them):
 *  - Status: every function except the *_destroy functions, the *_init
 *    functions, the three error/version queries, fsdp2_allocator and
 *    fsdp2_options_schema returns fsdp2_status_t.
 *    On failure fsdp2_last_error() returns a message saying what was wrong
 *    (per thread, valid until this thread's next failed call). No C++
 *    exception ever crosses this boundary, and a failed call leaves its
 *    output arguments unchanged.
 *  - Handles are opaque. Each *_create (and fsdp2_strategy_unshard, whose
 *    handle is an all-gather in flight) has a *_destroy that accepts NULL.
 *    A destroyed or never-created handle passed to any function gives
 *    FSDP2_ERROR_INVALID_HANDLE (handles are never reused), never a crash.
 *  - Ownership is written on every function: "borrowed" inputs are only
 *    read during the call; "caller-owned" outputs are written into memory
 *    the caller provides; memory the library allocates for the caller is
 *    freed with fsdp2_free() and nothing else.
 *  - Collective: marked functions must be called by every rank of the job,
 *    in the same order, or they wait until the strategy's timeout.
 *  - Threads: the library may be called from several threads, but one
 *    strategy (and the model and loader connected to it) is used by one
 *    thread at a time.
 *  - Enumerations are passed and stored as int32_t (the size of a C enum
 *    is up to the compiler); any other value is refused with
 *    FSDP2_ERROR_INVALID_ARGUMENT.
 *  - Option structs start with struct_size = sizeof(the struct) as the
 *    caller compiled it; later versions only append fields, and fields
 *    beyond an old caller's struct_size take their defaults. Always call
 *    the matching *_init() first.
 */
#ifndef FSDP2_C_API_FSDP2_H_
#define FSDP2_C_API_FSDP2_H_

#include <stddef.h>
#include <stdint.h>

/* Marks a function libfsdp2 exports: default ELF visibility with GCC and
 * Clang (the library's version script, c_api/fsdp2.lds, keeps only fsdp2_*
 * symbols), dllexport on Windows, nothing on other compilers. */
#if defined(_WIN32)
#define FSDP2_API __declspec(dllexport)
#elif defined(__GNUC__)
#define FSDP2_API __attribute__((visibility("default")))
#else
#define FSDP2_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ABI version: bumped on every incompatible change (never, we hope), while
 * compatible additions bump the minor number. */
#define FSDP2_ABI_VERSION_MAJOR 1
/* Bumped by every compatible addition (new functions, fields appended to an
 * option struct); a library of the same major and a minor at least the
 * header's has everything the header declares. */
#define FSDP2_ABI_VERSION_MINOR 9 /* 1.2: background saves, restarts, state files, activation checkpointing; 1.3: TorchScript units and options, memory stats; 1.4: fsdp2_restart_with_rank_environment; 1.5: device (GPUs), device memory stats; 1.6: prefetch depths, gradient accumulation and divide factor; 1.7: ignored parameters, prefetch lists; 1.8: Hugging Face Llama-family checkpoints, frozen parameters; 1.9: fsdp2_options_schema, fsdp2_strategy_create_from_json, fsdp2_step_options_from_json; explicit unshard (async handles) and reshard */
/* Major and minor as one number, major * 1000 + minor (1009 for 1.9): the
 * value fsdp2_abi_version() returns, so a caller can compare the two. */
#define FSDP2_ABI_VERSION (FSDP2_ABI_VERSION_MAJOR * 1000 + FSDP2_ABI_VERSION_MINOR)

/* The release version, the one in //:version.bzl (which also names the
 * wheel, the jar and the pkg-config/CMake files; packaging/version_test.sh
 * checks that the two agree). */
#define FSDP2_VERSION "1.9.0"

/* ------------------------------------------------------------------------
 * Status, errors, version, memory
 * ---------------------------------------------------------------------- */

/* What every fallible function returns; on anything but FSDP2_OK,
 * fsdp2_last_error() says what went wrong and fsdp2_status_name() names the
 * code. */
typedef enum fsdp2_status {
  FSDP2_OK = 0,                     /* success: the outputs are written */
  FSDP2_ERROR_INVALID_ARGUMENT = 1, /* bad value, NULL pointer, bad JSON */
  FSDP2_ERROR_INVALID_HANDLE = 2,   /* NULL, destroyed or foreign handle */
  FSDP2_ERROR_WRONG_ORDER = 3,      /* e.g. training before parallelize */
  FSDP2_ERROR_SHAPE = 4,            /* a buffer's dtype or shape is wrong */
  FSDP2_ERROR_IO = 5,               /* files: checkpoints, token files */
  FSDP2_ERROR_RUNTIME = 6,          /* communication, timeouts, LibTorch */
  FSDP2_ERROR_OUT_OF_MEMORY = 7,    /* an allocation failed, on the host or a GPU */
  FSDP2_ERROR_INTERNAL = 8          /* a bug in fsdp2: please report it */
} fsdp2_status_t;

/* The message of this thread's last failed call ("" if none). Borrowed:
 * valid until this thread's next failed call. Never NULL. */
FSDP2_API const char* fsdp2_last_error(void);

/* A constant name for a status, e.g. "FSDP2_ERROR_SHAPE". Never NULL. */
FSDP2_API const char* fsdp2_status_name(int32_t status);

/* FSDP2_ABI_VERSION of the loaded library; compare with the macro to detect
 * a header/library mismatch. */
FSDP2_API int32_t fsdp2_abi_version(void);

/* The library's version and build, e.g. "fsdp2 1.9.0 (LibTorch 2.11.0, cuda)".
 * Static storage. */
FSDP2_API const char* fsdp2_version_string(void);

/* Frees memory that the library allocated for the caller (see
 * fsdp2_strategy_optimizer_state_dict). Accepts NULL. */
FSDP2_API void fsdp2_free(void* pointer);

/* ------------------------------------------------------------------------
 * Launching ranks
 * ---------------------------------------------------------------------- */

/* Writes 1 to *is_rank if this process is one rank of a job (started by
 * fsdp2_launch_local, torchrun, srun or mpirun: RANK, SLURM_PROCID or
 * OMPI_COMM_WORLD_RANK is set), else 0. */
FSDP2_API fsdp2_status_t fsdp2_is_rank_process(int32_t* is_rank);

/* Runs this program again as `nproc` ranks on this machine (torchrun's
 * --nproc-per-node): the current executable is started with argv (borrowed:
 * the full command line, argv[0] first; for an interpreter, the script and
 * its arguments follow) and RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
 * MASTER_PORT set; their output is forwarded with "[rank r]" prefixes; if
 * one rank fails the others are stopped. threads_per_rank 0: cores / nproc.
 * Writes 0 to *exit_code when every rank succeeded, else the first failing
 * rank's code (128 + signal if killed). Blocks until all ranks end. */
FSDP2_API fsdp2_status_t fsdp2_launch_local(int32_t nproc, int32_t threads_per_rank,
                                            int argc, char** argv,
                                            int32_t* exit_code);

/* fsdp2_launch_local that, when a rank fails, stops all ranks and starts
 * them again up to `max_restarts` times; a rank whose fsdp2_restart_count is
 * positive should resume from its newest checkpoint. *exit_code: 0 once a
 * run succeeded, else the last run's code. */
FSDP2_API fsdp2_status_t fsdp2_launch_local_with_restarts(
    int32_t nproc, int32_t threads_per_rank, int32_t max_restarts, int argc, char** argv,
    int32_t* exit_code);

/* This rank's run of a job launched with restarts (0: the first, or none). */
FSDP2_API fsdp2_status_t fsdp2_restart_count(int32_t* restart_count);

/* The memory allocator this process runs with: "tcmalloc", "jemalloc" or
 * "system" (glibc's malloc). Ranks that fsdp2_launch_local starts run with
 * the one the FSDP2_ALLOCATOR variable asks for, tcmalloc unless it says
 * "jemalloc" or "system" (glibc's malloc faults large buffers in afresh
 * every step: see docs/main-job.md). Static storage; never NULL. */
FSDP2_API const char* fsdp2_allocator(void);

/* ABI 1.4. For a rank an outside launcher (torchrun, srun, mpirun) started:
 * the allocator is read when a process loads it, so when this process lacks
 * what fsdp2_launch_local gives its ranks (tcmalloc through LD_PRELOAD,
 * OMP_WAIT_POLICY=PASSIVE), re-executes its own binary with `argv` (the
 * whole command line, an interpreter's own arguments included; borrowed)
 * and those variables added, once, and does not return. Otherwise, or if
 * the restart fails (said on stderr), returns FSDP2_OK. Variables the caller
 * set are kept. Call it first thing; anything done before is done twice. */
FSDP2_API fsdp2_status_t fsdp2_restart_with_rank_environment(int argc, char** argv);

/* ------------------------------------------------------------------------
 * Tensors: caller-owned buffers described by pointer, dtype and shape
 * ---------------------------------------------------------------------- */

/* The element type of an fsdp2_tensor_t (stored as int32_t); see
 * fsdp2_dtype_size for the bytes per element. */
typedef enum fsdp2_dtype {
  FSDP2_DTYPE_FLOAT32 = 0,  /* IEEE 754 single, 4 bytes */
  FSDP2_DTYPE_FLOAT64 = 1,  /* IEEE 754 double, 8 bytes */
  FSDP2_DTYPE_BFLOAT16 = 2, /* brain float, 2 bytes (a uint16_t's bits) */
  FSDP2_DTYPE_FLOAT16 = 3,  /* IEEE 754 half, 2 bytes */
  FSDP2_DTYPE_INT64 = 4,    /* int64_t: token ids, class labels */
  FSDP2_DTYPE_INT32 = 5,    /* int32_t: token ids, token files */
  FSDP2_DTYPE_UINT16 = 6, /* token files only */
  /* uint8_t: tensors, and byte-level token files */
  FSDP2_DTYPE_UINT8 = 7
} fsdp2_dtype_t;

/* The most dimensions an fsdp2_tensor_t holds (the length of its shape
 * array); a tensor or parameter with more is refused with
 * FSDP2_ERROR_SHAPE. */
#define FSDP2_MAX_DIMS 8

/* A dense, C-contiguous (row-major) array in host memory. `data` is
 * borrowed for the duration of the call that receives it; the library never
 * keeps the pointer (inputs are copied or used in place during the call). */
typedef struct fsdp2_tensor {
  /* The first element; may be NULL only when the shape has no elements.
   * Read for inputs, written for outputs, never freed by the library. */
  void* data;
  int32_t dtype; /* an fsdp2_dtype_t */
  int32_t ndim; /* 0..FSDP2_MAX_DIMS */
  /* Sizes of the first ndim dimensions, each >= 0; the rest are ignored. */
  int64_t shape[FSDP2_MAX_DIMS];
} fsdp2_tensor_t;

/* Size in bytes of one element of `dtype`, 0 for an unknown dtype. */
FSDP2_API size_t fsdp2_dtype_size(int32_t dtype);

/* ------------------------------------------------------------------------
 * Strategy options
 * ---------------------------------------------------------------------- */

/* How FSDP shards the model over the data-parallel ranks (as PyTorch's
 * ShardingStrategy); the field sharding_strategy, default FULL_SHARD. */
typedef enum fsdp2_sharding_strategy {
  FSDP2_FULL_SHARD = 0,    /* shard params, grads, optimizer state */
  FSDP2_SHARD_GRAD_OP = 1, /* keep params unsharded from forward to backward */
  FSDP2_NO_SHARD = 2,      /* replicate, all-reduce gradients (DDP) */
  /* shard within groups, replicate across them */
  FSDP2_HYBRID_SHARD = 3
} fsdp2_sharding_strategy_t;

/* The dtypes units compute and reduce in (the mixed-precision policy);
 * the field precision, default BF16. Master weights and optimizer state
 * stay in the parameters' dtype. */
typedef enum fsdp2_precision {
  FSDP2_PRECISION_FP32 = 0, /* everything in float32 */
  /* bf16 params and compute, fp32 reductions */
  FSDP2_PRECISION_BF16 = 1
} fsdp2_precision_t;

/* The communication library of the process group; the field backend,
 * default GLOO. */
typedef enum fsdp2_backend {
  FSDP2_BACKEND_GLOO = 0, /* CPU */
  /* CUDA builds */
  FSDP2_BACKEND_NCCL = 1
} fsdp2_backend_t;

/* Where a rank trains (ABI 1.5). */
typedef enum fsdp2_device {
  FSDP2_DEVICE_AUTO = 0, /* its GPU where CUDA devices are visible, else the CPU */
  FSDP2_DEVICE_CPU = 1,  /* the CPU, even where GPUs are visible */
  /* GPU device_index, or (-1) local rank modulo the GPUs */
  FSDP2_DEVICE_CUDA = 2
} fsdp2_device_t;

/* What fsdp2_strategy_save_checkpoint writes (the target is a directory
 * in both); the field checkpoint_format, default SHARDED. Loading reads
 * either, saved on any number of ranks. */
typedef enum fsdp2_checkpoint_format {
  FSDP2_CHECKPOINT_SHARDED = 0, /* a directory; every rank writes its rows */
  /* one safetensors file, written by rank 0 */
  FSDP2_CHECKPOINT_FULL = 1
} fsdp2_checkpoint_format_t;

/* Activation checkpointing: which FSDP units recompute their activations
 * in backward instead of keeping them from forward (the units that
 * contain no other unit: each transformer/residual block, or a TorchScript
 * model as a whole). Losses and gradients are unchanged. */
typedef enum fsdp2_activation_checkpointing {
  FSDP2_AC_NONE = 0,      /* keep every activation (the default) */
  FSDP2_AC_FULL = 1,      /* recompute every block */
  /* recompute every ac_every-th block */
  FSDP2_AC_SELECTIVE = 2
} fsdp2_activation_checkpointing_t;

/* How micro-batches that do not sync gradients accumulate them (ABI 1.6). */
typedef enum fsdp2_gradient_accumulation {
  /* Each unit keeps its unsharded gradients; nothing is communicated until
   * the last micro-batch (fewest bytes; a whole model's gradients held). */
  FSDP2_ACCUMULATE_LOCAL = 0,
  /* Reduce-scatter every micro-batch inside the shard group (unsharded
   * gradients freed at once; one sharded gradient held), all-reduce across
   * replicas (HYBRID_SHARD's hosts) only at the last. */
  FSDP2_ACCUMULATE_SHARDED = 1
} fsdp2_gradient_accumulation_t;

/* How a strategy shards, communicates and trains: what
 * fsdp2_strategy_create takes. Fill it with fsdp2_strategy_options_init
 * (and fsdp2_strategy_options_from_json), then set fields; each field's
 * default is the one _init sets. */
typedef struct fsdp2_strategy_options {
  size_t struct_size;           /* sizeof(fsdp2_strategy_options_t) */
  int32_t data_parallel_size;   /* 0: "auto" */
  int32_t tensor_parallel_size; /* 0: "auto" */
  int32_t sharding_strategy;     /* an fsdp2_sharding_strategy_t */
  /* Whether units free their gathered parameters after forward (and
   * all-gather them again in backward). -1 (default): the sharding
   * strategy's choice, 0: no, 1: yes, k >= 2 (ABI 1.6): only down to groups
   * of k consecutive ranks (a host's), so backward all-gathers stay inside
   * them; k divides the shard group. Below -1: INVALID_ARGUMENT. */
  int32_t reshard_after_forward;
  int32_t shard_group_size;      /* HYBRID_SHARD ranks per group; 0: a node */
  int32_t precision;             /* an fsdp2_precision_t; default BF16 */
  /* 1: each rank's shards, gradients and optimizer state in host memory,
   * the optimizer stepping there unit by unit during the backward (since
   * ABI 1.9; refused before); on the CPU it changes nothing. 0 (default). */
  int32_t cpu_offload;
  int32_t backend;               /* an fsdp2_backend_t */
  int64_t timeout_ms;            /* collectives and rendezvous; > 0 */
  int32_t checkpoint_format;     /* an fsdp2_checkpoint_format_t */
  uint64_t seed;                 /* every rank is seeded with it */
  /* The data sampler (loaders made by this strategy). */
  int32_t shuffle;   /* 0 or 1 */
  int32_t drop_last; /* 1: drop a last partial global batch; 0: pad it */
  /* Since ABI 1.2. */
  int32_t activation_checkpointing; /* an fsdp2_activation_checkpointing_t */
  int32_t ac_every;                 /* SELECTIVE: every k-th block, >= 1; default 2 */
  /* Since ABI 1.5. */
  int32_t device;       /* an fsdp2_device_t; default AUTO */
  int32_t device_index; /* CUDA: the GPU's number; -1 (default): the local rank's */
  /* Since ABI 1.6: fully_shard's controls. Prefetch: how many units ahead
   * forward / backward all-gather (0: none, least memory; each further
   * unit costs one more unit's parameters held). */
  int32_t forward_prefetch;      /* >= 0; default 1 */
  int32_t backward_prefetch;     /* >= 0; default 1 */
  int32_t gradient_accumulation; /* an fsdp2_gradient_accumulation_t; default LOCAL */
  /* Reduced gradients are divided by this; 0 (default): the data-parallel
   * size (the mean), 1: the sum. Negative or not finite: INVALID_ARGUMENT. */
  double gradient_divide_factor;
  /* Since ABI 1.7. The strings below are borrowed until
   * fsdp2_strategy_create returns (it copies them); those that
   * fsdp2_strategy_options_from_json sets are the library's, kept until the
   * process ends. NULL or "" (the defaults): none.
   * Parameters kept out of sharding (ignored): names as the model names its
   * parameters, or glob patterns over them (fnmatch's *, ?, [...]; * also
   * matches dots), separated by commas: "lm_head.weight,*.bias". Each stays
   * whole on every rank (its full size in memory on each), never sharded,
   * all-gathered or reduced by FSDP. Under BF16 precision each is cast to
   * bf16 with its block for its forward and backward, its value, gradient
   * and optimizer state staying in its own dtype. A pattern that matches
   * no parameter fails fsdp2_strategy_parallelize (INVALID_ARGUMENT). */
  const char* ignored_params;
  /* 1: backward all-reduces the ignored parameters' gradients over the
   * data-parallel ranks (divided as FSDP's are: training equals one
   * process); 0 (default): each rank keeps its own (PyTorch's rule), and the
   * ranks' copies drift apart. Anything else: INVALID_ARGUMENT. */
  int32_t ignored_params_all_reduce;
  /* Explicit prefetch lists, in place of the depths for the units named:
   * "unit:listed,listed;unit:listed" with the model's module names
   * ("blocks.0:blocks.1,blocks.2" makes blocks.0's forward all-gather
   * blocks.1 and blocks.2 too; the root is ""). Listed units must be
   * sharded and come after the unit in the pass (forward: module order;
   * backward: the reverse), else fsdp2_strategy_parallelize fails
   * (INVALID_ARGUMENT) naming them. Each listed unit costs its parameters
   * held from the unit's turn to its own. This one: forward's lists. */
  const char* forward_prefetch_modules;
  /* Backward's lists, in the same syntax: the units listed after a unit
   * are all-gathered in its backward, in place of backward_prefetch. */
  const char* backward_prefetch_modules;
  /* Since ABI 1.8. Parameters not trained at all (fine-tuning part of a
   * model): names or glob patterns as for ignored_params. They get no
   * gradient, no gradient memory, no reduction and no optimizer state;
   * they are still sharded and saved. A pattern that matches no parameter
   * fails fsdp2_strategy_parallelize (INVALID_ARGUMENT). */
  const char* frozen_params;
  /* Since ABI 1.9: CPU offload's controls (cpu_offload above). 1 (default):
   * host buffers in page-locked memory, so that copies to and from the GPU
   * run asynchronously; 0: pageable. Anything else: INVALID_ARGUMENT. */
  int32_t pin_memory;
  /* Caps this process's GPU memory at this many GiB (PyTorch's per-process
   * memory fraction): a smaller GPU, emulated; a step that does not fit
   * fails with FSDP2_ERROR_OUT_OF_MEMORY. 0 (default): the whole GPU;
   * ignored on the CPU. Negative or not finite: INVALID_ARGUMENT. */
  double gpu_memory_limit_gib;
  /* Since ABI 1.9: a Chrome/Perfetto trace of profile_steps training steps
   * (0, the default: none) through LibTorch's profiler: CPU ops and, on a
   * GPU, CUDA kernels, copies and the collectives' streams. Tracing starts
   * after profile_wait_steps steps (default 1) and the file is written
   * after the last traced step, or when the strategy is torn down first.
   * profile_path (default "fsdp2_trace.json"; with several ranks rank r
   * writes it with ".rank<r>" before the extension) is copied. Negative
   * counts, or steps without a path: INVALID_ARGUMENT. */
  int32_t profile_steps;
  /* Since ABI 1.9: steps run before the trace starts (default 1). */
  int32_t profile_wait_steps;
  /* Since ABI 1.9: the trace file (default "fsdp2_trace.json"). */
  const char* profile_path;
} fsdp2_strategy_options_t;

/* Fills `options` with the defaults, each option's in the library's option
 * table (fsdp2_options_schema): auto sizes, FULL_SHARD, BF16, gloo, 5
 * minutes, sharded checkpoints, seed 0, shuffle, drop_last, no activation
 * checkpointing (ac_every 2), prefetch 1, ... */
FSDP2_API void fsdp2_strategy_options_init(fsdp2_strategy_options_t* options);

/* Updates `options` from a JSON object whose keys are the field names
 * above (sizes may also be "auto"; enums are strings: "full_shard",
 * "bf16"/"fp32", "gloo"/"nccl", "sharded"/"full",
 * "activation_checkpointing": "none"/"full"/"selective" or false/true,
 * "gradient_accumulation": "local"/"sharded", "ignored_params" and
 * "frozen_params": a string or a list of strings, "forward_prefetch_modules" and
 * "backward_prefetch_modules": a string or an object such as
 * {"blocks.0": ["blocks.1", "blocks.2"]}), e.g.
 *   {"data_parallel_size": "auto", "sharding_strategy": "no_shard"}
 * Keys not given keep their value. Unknown keys, wrong types, values out of
 * their option's range (e.g. a negative forward_prefetch) and bad JSON
 * fail with FSDP2_ERROR_INVALID_ARGUMENT and leave `options` unchanged.
 * `json` is borrowed. */
FSDP2_API fsdp2_status_t fsdp2_strategy_options_from_json(
    const char* json, fsdp2_strategy_options_t* options);

/* Since ABI 1.9. Every option the library takes, as one JSON object (static
 * storage; never NULL): {"strategy": [...], "optimizer": [...], "step":
 * [...]}, the options of fsdp2_strategy_options_t,
 * fsdp2_optimizer_options_t and fsdp2_step_options_t, each a list of
 * {"name" (the field and JSON key), "type" ("bool", "int", "uint64",
 * "number", "choice", "size": "auto" or an int, "text": a string or null),
 * "default" (as JSON), "doc" (one line), and where they apply "choices"
 * (the names; an enumeration's codes are their positions), "min", "max",
 * "min_exclusive", "max_exclusive", "requirement" (the range in words),
 * "flag" (the main job's flag, "" for none), "flag_default", "flag_note",
 * "see" (a page of docs/), "cpp" (the C++ field)}. The bindings read it:
 * Python's keywords and their documentation, Java's test of its builder,
 * the docs' tables. */
FSDP2_API const char* fsdp2_options_schema(void);

/* ------------------------------------------------------------------------
 * Models
 * ---------------------------------------------------------------------- */

/* A model handle: the module to train and how its batches become a loss.
 * Made by fsdp2_model_create (or _create_deferred, _load_torchscript*),
 * freed by fsdp2_model_destroy. */
typedef struct fsdp2_model fsdp2_model_t;
/* A strategy handle: one rank's FSDP2 training state (process group, mesh,
 * sharded model, optimizer, counters). Made by fsdp2_strategy_create, freed
 * by fsdp2_strategy_destroy; one thread at a time. */
typedef struct fsdp2_strategy fsdp2_strategy_t;

/* Builds a model from a JSON configuration (borrowed). Families:
 *  - GPT-style decoder (token embedding, pre-LayerNorm transformer blocks,
 *    tied LM head); batch = {tokens [B,T] int64/int32, targets [B,T]},
 *    loss = mean next-token cross-entropy, prediction = logits [B,T,vocab]
 *    float32:
 *      {"family": "gpt", "vocab_size": 256, "block_size": 64,
 *       "n_layer": 2, "n_head": 2, "n_embd": 64, "dropout": 0}
 *    (dropout: probability in training, GPT-2's places; 0 draws nothing)
 *  - MLP with residual blocks; batch = {x [B,in] float32/float64,
 *    y [B,out] float (mean squared error) or [B] int64 (cross-entropy)},
 *    prediction = [B,out]:
 *      {"family": "mlp", "in_features": 16, "hidden": 32,
 *       "out_features": 4, "depth": 2}
 *  - (since ABI 1.8) a Hugging Face Llama, Mistral or Qwen2 checkpoint
 *    directory (config.json and model.safetensors, or shards with
 *    model.safetensors.index.json, as transformers' save_pretrained writes
 *    them); batch and prediction as for "gpt". Its weights load in
 *    fsdp2_strategy_parallelize, each rank reading only its rows (with
 *    fsdp2_model_create_deferred no rank ever holds the model);
 *    parameters are float32 unless "dtype" says ("bfloat16", "float16",
 *    "float64"), whatever the files store:
 *      {"family": "hf", "path": "/models/llama", "dtype": "float32"}
 *    A config.json the model cannot represent fails here
 *    (INVALID_ARGUMENT naming the field); a missing, extra or mis-shaped
 *    tensor fails fsdp2_strategy_parallelize (IO, naming it) before any
 *    parameter is written.
 * Omitted sizes take the values shown. Sizes whose parameters cannot fit in
 * this machine's memory (its physical memory, or its cgroup's limit) are
 * refused before anything is built: INVALID_ARGUMENT naming the field and
 * the bytes. An allocation that fails is FSDP2_ERROR_OUT_OF_MEMORY.
 * Parameters are initialised from the
 * global generator: create the model after fsdp2_strategy_setup_environment
 * (which seeds every rank alike) so every rank starts equal.
 * Each transformer/residual block becomes one FSDP unit, then the root. */
FSDP2_API fsdp2_status_t fsdp2_model_create(const char* config_json,
                                            fsdp2_model_t** out);

/* As fsdp2_model_create, but built under the strategy's
 * tensor_init_context(): the parameters take no memory until
 * fsdp2_strategy_parallelize, which gives each rank only its rows of them,
 * with values bit-identical to fsdp2_model_create after the same seed. So a
 * model larger than one rank's memory can be built (the size refused is
 * one whose parameters divided over the ranks do not fit). After
 * setup_environment; not with tensor_parallel_size > 1 (parallelize says
 * so). */
FSDP2_API fsdp2_status_t fsdp2_model_create_deferred(fsdp2_strategy_t* strategy,
                                                     const char* config_json,
                                                     fsdp2_model_t** out);

/* Loads a TorchScript module saved by torch.jit.save (Python) or
 * torch::jit::Module::save, with the default wrapping: the same as
 * fsdp2_model_load_torchscript_with_options with {"loss": loss}. */
FSDP2_API fsdp2_status_t fsdp2_model_load_torchscript(const char* path,
                                                      const char* loss,
                                                      fsdp2_model_t** out);

/* Loads a TorchScript module with options, a JSON object (borrowed):
 *   "loss"       "mse" (default) or "cross_entropy": every batch tensor but
 *                the last goes to the script's forward, positionally; the
 *                last is the target. "model": every tensor goes to forward,
 *                which returns the loss as a floating-point scalar.
 *   "auto_wrap"  the submodules that become FSDP units of their own.
 *                Absent: every child of every torch.nn.ModuleList, at any
 *                depth, that has parameters. A list: submodule paths
 *                ("blocks.3") and scripted class names ("Block", or
 *                "mymodel.Block"). []: the whole script is one unit. The
 *                root is always a unit of its own.
 * No change to the file is needed; parameters keep the script's dotted
 * names. Wrapping rules, and units that run on only some ranks: see
 * c_api/README.md. Errors: FSDP2_ERROR_IO (file), _INVALID_ARGUMENT (JSON,
 * key, loss, an auto_wrap entry that names nothing or the root: the message
 * lists the script's classes); at the first step _SHAPE when the batch does
 * not fit the forward's arity, _INVALID_ARGUMENT for a non-scalar "model"
 * loss. */
FSDP2_API fsdp2_status_t fsdp2_model_load_torchscript_with_options(const char* path,
                                                                   const char* options_json,
                                                                   fsdp2_model_t** out);

/* Releases the caller's reference. A strategy the model is connected to
 * keeps its own. Accepts NULL. */
FSDP2_API void fsdp2_model_destroy(fsdp2_model_t* model);

/* Number of parameter tensors and elements (global, unsharded). */
FSDP2_API fsdp2_status_t fsdp2_model_num_parameters(const fsdp2_model_t* model,
                                                    int64_t* num_tensors,
                                                    int64_t* num_elements);

/* ------------------------------------------------------------------------
 * Optimizer
 * ---------------------------------------------------------------------- */

/* The optimizer the strategy builds over the local shards (the field kind
 * of fsdp2_optimizer_options_t, default ADAMW). */
typedef enum fsdp2_optimizer_kind {
  FSDP2_OPTIMIZER_ADAMW = 0, /* Adam with decoupled weight decay */
  FSDP2_OPTIMIZER_ADAM = 1,  /* Adam; weight_decay is added to the gradient */
  /* SGD with optional momentum */
  FSDP2_OPTIMIZER_SGD = 2
} fsdp2_optimizer_kind_t;

/* The optimizer fsdp2_strategy_connect builds (at parallelize). Fill it
 * with fsdp2_optimizer_options_init, whose defaults each field names. */
typedef struct fsdp2_optimizer_options {
  size_t struct_size; /* sizeof(fsdp2_optimizer_options_t) */
  int32_t kind;       /* an fsdp2_optimizer_kind_t */
  double lr;                /* learning rate, > 0; default 1e-3 */
  double beta1;             /* Adam(W) first-moment decay, [0, 1); default 0.9 */
  double beta2;             /* Adam(W) second-moment decay, [0, 1); default 0.999 */
  double eps;               /* Adam(W) denominator term, > 0; default 1e-8 */
  double weight_decay;      /* >= 0; default 0.01 */
  double momentum;          /* SGD */
} fsdp2_optimizer_options_t;

/* Defaults: AdamW, lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay
 * 0.01, momentum 0. */
FSDP2_API void fsdp2_optimizer_options_init(fsdp2_optimizer_options_t* options);

/* As fsdp2_strategy_options_from_json: keys are the field names; "kind" is
 * "adamw", "adam" or "sgd". */
FSDP2_API fsdp2_status_t fsdp2_optimizer_options_from_json(
    const char* json, fsdp2_optimizer_options_t* options);

/* ------------------------------------------------------------------------
 * The strategy
 * ---------------------------------------------------------------------- */

/* A data loader handle: a memory-mapped token file, cut into global batches.
 * Made by fsdp2_dataloader_create_from_token_file, freed by
 * fsdp2_dataloader_destroy; its batches are this rank's rows, for the
 * strategy that made it. */
typedef struct fsdp2_dataloader fsdp2_dataloader_t;

/* Creates a strategy (no communication yet). `options` is borrowed; NULL
 * means the defaults. Invalid options fail here with a message saying what
 * to change. */
FSDP2_API fsdp2_status_t fsdp2_strategy_create(
    const fsdp2_strategy_options_t* options, fsdp2_strategy_t** out);

/* Since ABI 1.9. As fsdp2_strategy_create from a JSON object of options
 * (borrowed; the keys and values of fsdp2_strategy_options_from_json, those
 * not given at their defaults), without the struct: nothing of it outlives
 * the call (from_json keeps its strings until the process ends). The
 * Python and Java bindings create their strategies this way. */
FSDP2_API fsdp2_status_t fsdp2_strategy_create_from_json(const char* options_json,
                                                         fsdp2_strategy_t** out);

/* Tears down (as fsdp2_strategy_teardown) and frees. Accepts NULL. */
FSDP2_API void fsdp2_strategy_destroy(fsdp2_strategy_t* strategy);

/* Collective. Reads the cluster environment (torchrun's RANK/WORLD_SIZE/
 * MASTER_ADDR/MASTER_PORT, SLURM, Open MPI; none: one process), joins the
 * process group, builds the (dp, tp) device mesh and seeds every rank. */
FSDP2_API fsdp2_status_t fsdp2_strategy_setup_environment(
    fsdp2_strategy_t* strategy);

/* This process's rank, the world size, and its data-parallel rank and size.
 * After setup_environment. Any output may be NULL. */
FSDP2_API fsdp2_status_t fsdp2_strategy_rank_info(const fsdp2_strategy_t* strategy,
                                                  int32_t* rank,
                                                  int32_t* world_size,
                                                  int32_t* data_parallel_rank,
                                                  int32_t* data_parallel_size);

/* Attaches the model to train and how to build its optimizer (`optimizer`
 * borrowed; NULL: defaults). The strategy keeps a reference to the model.
 * Once, before parallelize. */
FSDP2_API fsdp2_status_t fsdp2_strategy_connect(
    fsdp2_strategy_t* strategy, fsdp2_model_t* model,
    const fsdp2_optimizer_options_t* optimizer);

/* Collective. Shards the model (each block, then the root) and builds the
 * optimizer over the local shards. A second call does nothing. */
FSDP2_API fsdp2_status_t fsdp2_strategy_parallelize(fsdp2_strategy_t* strategy);

/* Per-step controls of fsdp2_strategy_training_step(_loader). Fill it with
 * fsdp2_step_options_init (accumulate_grad_batches 1, no clipping). */
typedef struct fsdp2_step_options {
  size_t struct_size;              /* sizeof(fsdp2_step_options_t) */
  /* The batch's rows are split into this many equal micro-batches; their
   * gradients accumulate locally and are reduced once, on the last. */
  int32_t accumulate_grad_batches; /* >= 1; rows must divide evenly */
  double gradient_clip_val;        /* global max norm; 0: no clipping */
} fsdp2_step_options_t;

/* Defaults: no accumulation, no clipping. */
FSDP2_API void fsdp2_step_options_init(fsdp2_step_options_t* options);

/* Since ABI 1.9. Updates `options` from a JSON object whose keys are the
 * field names above, e.g. {"accumulate_grad_batches": 4}; as
 * fsdp2_strategy_options_from_json (unknown keys, wrong types and values
 * out of range fail with INVALID_ARGUMENT and leave `options` unchanged).
 * `json` is borrowed. */
FSDP2_API fsdp2_status_t fsdp2_step_options_from_json(const char* json,
                                                      fsdp2_step_options_t* options);

/* What fsdp2_strategy_training_step(_loader) reports; the same on every
 * rank. */
typedef struct fsdp2_step_result {
  double loss;      /* mean over micro-batches and data-parallel ranks */
  double grad_norm; /* global norm before clipping (0 without clipping) */
  int64_t step;     /* optimizer steps taken so far */
} fsdp2_step_result_t;

/* Collective. One optimizer step on this rank's rows of the global batch:
 * forward, backward, gradient reduction (reduce-scatter), clipping and the
 * optimizer step; applies a pending load_optimizer_state_dict first.
 * `batch` is `num_tensors` borrowed, caller-owned tensors (see the model
 * family for what they are); `options` NULL means the defaults. The result
 * is written to the caller-owned `result` (may be NULL). */
FSDP2_API fsdp2_status_t fsdp2_strategy_training_step(
    fsdp2_strategy_t* strategy, const fsdp2_tensor_t* batch, size_t num_tensors,
    int64_t batch_idx, const fsdp2_step_options_t* options,
    fsdp2_step_result_t* result);

/* Collective. The loss of `batch` without gradients, averaged over the
 * data-parallel ranks, into the caller-owned `loss`. */
FSDP2_API fsdp2_status_t fsdp2_strategy_validation_step(
    fsdp2_strategy_t* strategy, const fsdp2_tensor_t* batch, size_t num_tensors,
    int64_t batch_idx, double* loss);
/* Collective. As fsdp2_strategy_validation_step, through the model's test
 * step: the loss of `batch` without gradients, averaged over the
 * data-parallel ranks. After parallelize (else WRONG_ORDER). */
FSDP2_API fsdp2_status_t fsdp2_strategy_test_step(
    fsdp2_strategy_t* strategy, const fsdp2_tensor_t* batch, size_t num_tensors,
    int64_t batch_idx, double* loss);

/* The shape predict_step gives for `batch` (the model family's prediction,
 * see fsdp2_model_create), into the caller-owned `output`'s dtype, ndim and
 * shape (its data is not touched). */
FSDP2_API fsdp2_status_t fsdp2_strategy_predict_shape(
    fsdp2_strategy_t* strategy, const fsdp2_tensor_t* batch, size_t num_tensors,
    fsdp2_tensor_t* output);

/* Collective (the forward gathers parameters). This rank's prediction for
 * its rows, written into the caller-owned `output`, whose dtype and shape
 * must be what fsdp2_strategy_predict_shape says (FSDP2_ERROR_SHAPE
 * otherwise, with the expected shape in the message). */
FSDP2_API fsdp2_status_t fsdp2_strategy_predict_step(
    fsdp2_strategy_t* strategy, const fsdp2_tensor_t* batch, size_t num_tensors,
    int64_t batch_idx, fsdp2_tensor_t* output);

/* Collective. Writes model, optimizer state and the epoch/step counters to
 * the directory `path` (borrowed; in both formats) in the strategy's checkpoint
 * format, atomically: a kill mid-save leaves the previous checkpoint loadable. */
FSDP2_API fsdp2_status_t fsdp2_strategy_save_checkpoint(
    fsdp2_strategy_t* strategy, const char* path);

/* Flags of fsdp2_strategy_save_checkpoint_ex, or-ed into its `flags`
 * (0: a synchronous save). FSDP2_SAVE_ASYNC: write the files on a
 * background thread. */
typedef enum fsdp2_save_flags { FSDP2_SAVE_ASYNC = 1 } fsdp2_save_flags_t;

/* Collective. With FSDP2_SAVE_ASYNC the collective part runs now and stages
 * this rank's tensors; a background thread writes the files (atomically)
 * while training goes on. At most one save is in flight: the next save, a
 * load, a remove and teardown wait for it and report its error. */
FSDP2_API fsdp2_status_t fsdp2_strategy_save_checkpoint_ex(
    fsdp2_strategy_t* strategy, const char* path, uint32_t flags);

/* Waits for this rank's part of a background save; returns its error. */
FSDP2_API fsdp2_status_t fsdp2_strategy_wait_for_checkpoint(fsdp2_strategy_t* strategy);

/* 1 while this rank is still writing a background save, else 0. */
FSDP2_API fsdp2_status_t fsdp2_strategy_checkpoint_in_flight(
    const fsdp2_strategy_t* strategy, int32_t* in_flight);

/* Collective. Loads a checkpoint of either format, saved on any number of
 * ranks, into the parallelized model and optimizer and restores the
 * counters. Every tensor's checksum is verified; on error the model is
 * unchanged. */
FSDP2_API fsdp2_status_t fsdp2_strategy_load_checkpoint(
    fsdp2_strategy_t* strategy, const char* path);

/* Collective. Deletes a checkpoint written by fsdp2; refuses other paths. */
FSDP2_API fsdp2_status_t fsdp2_strategy_remove_checkpoint(
    fsdp2_strategy_t* strategy, const char* path);

/* This rank's optimizer state (the state of its shards), serialized, in
 * memory the library allocates: free *data with fsdp2_free. After
 * parallelize. */
FSDP2_API fsdp2_status_t fsdp2_strategy_optimizer_state_dict(
    fsdp2_strategy_t* strategy, void** data, size_t* size);

/* Keeps a copy of `data` (borrowed) and applies it at the next training
 * step, once (deferred restoration, as the spec's
 * load_optimizer_state_dict). */
FSDP2_API fsdp2_status_t fsdp2_strategy_load_optimizer_state_dict(
    fsdp2_strategy_t* strategy, const void* data, size_t size);

/* Whether an optimizer state waits for the next training step. */
FSDP2_API fsdp2_status_t fsdp2_strategy_has_pending_optimizer_state(
    const fsdp2_strategy_t* strategy, int32_t* pending);

/* The model's parameters, in order: how many there are, and the name,
 * dtype and global (unsharded) shape of one of them. The name is borrowed
 * and lives as long as the strategy. After parallelize. */
FSDP2_API fsdp2_status_t fsdp2_strategy_num_parameters(
    const fsdp2_strategy_t* strategy, int64_t* count);
/* Parameter `index` (0 <= index < count, else INVALID_ARGUMENT): its name
 * into *name (borrowed, valid while the strategy lives) and its dtype,
 * ndim and global shape into the caller-owned *info, whose data is set to
 * NULL. Either output may be NULL. After parallelize (else WRONG_ORDER). */
FSDP2_API fsdp2_status_t fsdp2_strategy_parameter_info(
    const fsdp2_strategy_t* strategy, int64_t index, const char** name,
    fsdp2_tensor_t* info);

/* Collective. Copies the full (unsharded) value of parameter `name` into the
 * caller-owned `value` (its dtype and shape must match parameter_info). */
FSDP2_API fsdp2_status_t fsdp2_strategy_get_parameter(fsdp2_strategy_t* strategy,
                                                      const char* name,
                                                      fsdp2_tensor_t* value);

/* Sets parameter `name` from a full value (borrowed; same dtype and shape):
 * each rank keeps its own rows, so every rank must pass the same value. */
FSDP2_API fsdp2_status_t fsdp2_strategy_set_parameter(
    fsdp2_strategy_t* strategy, const char* name, const fsdp2_tensor_t* value);

/* Collective. Full parameters by name from a safetensors file: a PyTorch
 * state_dict() saved as safetensors, or a full checkpoint (optimizer entries
 * skipped). Names and shapes must match; each rank keeps its rows. Since
 * ABI 1.8 also a Hugging Face checkpoint (a directory with
 * model.safetensors or model.safetensors.index.json), each rank reading
 * only its rows. */
FSDP2_API fsdp2_status_t fsdp2_strategy_load_model_state_dict_file(
    fsdp2_strategy_t* strategy, const char* path);

/* Since ABI 1.8. Collective. Writes the model ("hf" family) to directory
 * `dir` as transformers' save_pretrained does: config.json, and
 * model.safetensors or shards model-0000i-of-0000N.safetensors with
 * model.safetensors.index.json; from_pretrained(dir) loads it. The source
 * checkpoint's tokenizer files and generation_config.json are copied along
 * (one is written from config.json where the source has none). A model
 * with LoRA adapters ("lora_rank" in its configuration) writes only the
 * adapters, in PEFT's layout (adapter_model.safetensors,
 * adapter_config.json), unless "merged" asks for the whole model with the
 * adapters merged into its weights. Atomic: an interrupted save leaves the
 * previous one. A directory holding other files is refused (IO).
 * `options_json` (borrowed; NULL: defaults):
 * {"max_shard_size": "5GB" (or "500MB", "2GiB", a number of bytes),
 *  "dtype": "bfloat16" (default: the parameters' own),
 *  "merged": false}.
 * INVALID_ARGUMENT for a model of another family. */
FSDP2_API fsdp2_status_t fsdp2_strategy_save_hf_checkpoint(fsdp2_strategy_t* strategy,
                                                           const char* dir,
                                                           const char* options_json);

/* Epoch and optimizer steps taken (restored by load_checkpoint). */
FSDP2_API fsdp2_status_t fsdp2_strategy_current_epoch_step(
    const fsdp2_strategy_t* strategy, int64_t* epoch, int64_t* step);
/* Sets the epoch counter (>= 0, else INVALID_ARGUMENT) that checkpoints save
 * and fsdp2_strategy_current_epoch_step reports. Local; it does not
 * reshuffle a loader: call fsdp2_dataloader_set_epoch for that. */
FSDP2_API fsdp2_status_t fsdp2_strategy_set_epoch(fsdp2_strategy_t* strategy,
                                                  int64_t epoch);

/* Memory (ABI 1.3): this rank's, in bytes. Set struct_size (as _init does);
 * the library fills the fields that fit and keeps it. Sharded: this rank's
 * rows (all on one rank or with NO_SHARD). Unsharded: the full copies units
 * compute with (gathered or cast to bf16; none in fp32 on one rank or with
 * NO_SHARD). Peaks are process-wide, since parallelize (unsharded) or the
 * process's start (RSS), or the last reset. */
typedef struct fsdp2_memory_stats {
  size_t struct_size; /* sizeof(fsdp2_memory_stats_t), as _init sets it; kept */
  int64_t sharded_param_bytes; /* this rank's rows of the parameters */
  int64_t sharded_grad_bytes; /* grads: 0 but between a backward and its step */
  int64_t optimizer_state_bytes; /* its state tensors (AdamW: 2 x sharded params) */
  int64_t unsharded_param_bytes; /* gathered, compute dtype */
  int64_t peak_unsharded_param_bytes; /* the most unsharded_param_bytes held */
  int64_t unsharded_grad_bytes;  /* accumulated without gradient sync */
  int64_t total_param_bytes;     /* the global model in its dtype, tied ones once */
  int64_t rss_bytes; /* the process's resident memory now (VmRSS) */
  int64_t peak_rss_bytes; /* VmHWM (>= rss_bytes) */
  /* Since ABI 1.5; 0 on the CPU. On a GPU, PyTorch's caching allocator:
   * bytes in tensors, bytes held from the driver, and their peaks. This
   * one: bytes in live tensors. */
  int64_t device_allocated_bytes;
  int64_t device_reserved_bytes; /* bytes the allocator holds from the driver */
  int64_t peak_device_allocated_bytes; /* the most device_allocated_bytes */
  int64_t peak_device_reserved_bytes; /* the most device_reserved_bytes */
} fsdp2_memory_stats_t;
/* Zeroes *stats and sets struct_size. Accepts NULL. */
FSDP2_API void fsdp2_memory_stats_init(fsdp2_memory_stats_t* stats);
/* Local. After parallelize (else WRONG_ORDER), also after teardown. NULL
 * stats or a struct_size below sizeof(size_t): INVALID_ARGUMENT. */
FSDP2_API fsdp2_status_t fsdp2_strategy_memory_stats(const fsdp2_strategy_t* strategy,
                                                     fsdp2_memory_stats_t* stats);
/* Local: both peaks restart from now. After parallelize. FSDP2_ERROR_IO (and
 * nothing reset) if /proc/self/clear_refs cannot be written. */
FSDP2_API fsdp2_status_t fsdp2_strategy_reset_peak_memory_stats(fsdp2_strategy_t* strategy);

/* Explicit unshard and reshard (since ABI 1.9), as PyTorch's
 * FSDPModule.unshard(async_op) and reshard(): gather one sharded module's
 * parameters ahead of its forward (to overlap the all-gather with work of
 * the caller's own), or free them. `module` (borrowed) is the module's name
 * as the model names its modules ("blocks.0"; "" is the root) and must be
 * sharded (an FSDP unit: each transformer/residual block and the root of a
 * built-in family; a TorchScript file's wrapped submodules and its root).
 * An unknown or unsharded name is INVALID_ARGUMENT naming it; before
 * fsdp2_strategy_parallelize, WRONG_ORDER. Both are collective over the
 * module's shard group: every rank makes the same calls in the same
 * order. */

/* An all-gather started by fsdp2_strategy_unshard: wait for it with
 * fsdp2_unshard_handle_wait, free it with fsdp2_unshard_handle_destroy. */
typedef struct fsdp2_unshard_handle fsdp2_unshard_handle_t;

/* Collective. All-gathers the parameters of the sharded module `module`;
 * its next forward finds them gathered and reshards after it as the
 * strategy's options say. async_op 0: returns when they are gathered; 1:
 * returns at once with the all-gather in flight, which
 * fsdp2_unshard_handle_wait, the module's forward or fsdp2_strategy_reshard
 * completes. Anything else: INVALID_ARGUMENT. `out` (may be NULL) receives
 * a new caller-owned handle on the all-gather (after a synchronous call it
 * has nothing left to wait for); destroy it with
 * fsdp2_unshard_handle_destroy. */
FSDP2_API fsdp2_status_t fsdp2_strategy_unshard(fsdp2_strategy_t* strategy, const char* module,
                                                int32_t async_op, fsdp2_unshard_handle_t** out);

/* Waits for the handle's all-gather: the module's parameters are then
 * whole. Once: later calls, and calls after the module's forward, its
 * reshard or the strategy's end, return FSDP2_OK at once. */
FSDP2_API fsdp2_status_t fsdp2_unshard_handle_wait(fsdp2_unshard_handle_t* handle);

/* Frees the handle without waiting (the module's forward or reshard still
 * completes the all-gather). Accepts NULL. */
FSDP2_API void fsdp2_unshard_handle_destroy(fsdp2_unshard_handle_t* handle);

/* Collective. Frees the gathered parameters of the sharded module
 * `module`, waiting for an all-gather in flight first; nothing when they
 * are sharded. */
FSDP2_API fsdp2_status_t fsdp2_strategy_reshard(fsdp2_strategy_t* strategy, const char* module);

/* Collective. Waits until every rank arrives. */
FSDP2_API fsdp2_status_t fsdp2_strategy_barrier(fsdp2_strategy_t* strategy);

/* Drops the optimizer and pending state; the strategy can no longer train. */
FSDP2_API fsdp2_status_t fsdp2_strategy_teardown(fsdp2_strategy_t* strategy);

/* ------------------------------------------------------------------------
 * Data loaders: batches read natively, no copying by the caller
 * ---------------------------------------------------------------------- */

/* How fsdp2_dataloader_create_from_token_file reads and batches a file.
 * Fill it with fsdp2_token_loader_options_init, whose defaults are below. */
typedef struct fsdp2_token_loader_options {
  size_t struct_size;        /* sizeof(fsdp2_token_loader_options_t) */
  int32_t token_dtype;       /* UINT8 (a text file's bytes), UINT16, INT32 */
  int64_t block_size;        /* tokens per sample; windows hold block_size+1 */
  int64_t global_batch_size; /* rows per step over all data-parallel ranks */
  /* The part of the file's windows this loader uses, as fractions of them:
   * e.g. [0, 0.95) for training and [0.95, 1) for validation. Need
   * 0 <= begin_fraction < end_fraction <= 1. This one: the start, default 0. */
  double begin_fraction;
  double end_fraction; /* the end (exclusive); default 1 */
} fsdp2_token_loader_options_t;

/* Defaults: UINT8, block 64, global batch 8, the whole file. */
FSDP2_API void fsdp2_token_loader_options_init(
    fsdp2_token_loader_options_t* options);

/* Memory-maps a file of tokens (native byte order) and cuts it into
 * non-overlapping windows of block_size + 1 tokens: inputs are the first
 * block_size, targets the last. The strategy's sampler (after
 * setup_environment) decides this rank's rows of each global batch, so the
 * sequence of global batches does not depend on the number of ranks. */
FSDP2_API fsdp2_status_t fsdp2_dataloader_create_from_token_file(
    fsdp2_strategy_t* strategy, const char* path,
    const fsdp2_token_loader_options_t* options, fsdp2_dataloader_t** out);

/* Accepts NULL. */
FSDP2_API void fsdp2_dataloader_destroy(fsdp2_dataloader_t* loader);

/* Global batches per epoch. */
FSDP2_API fsdp2_status_t fsdp2_dataloader_num_batches(
    const fsdp2_dataloader_t* loader, int64_t* count);

/* Reshuffles for `epoch` (the order depends only on the seed and epoch). */
FSDP2_API fsdp2_status_t fsdp2_dataloader_set_epoch(fsdp2_dataloader_t* loader,
                                                    int64_t epoch);

/* As training_step / validation_step, on the loader's batch `batch_idx`. */
FSDP2_API fsdp2_status_t fsdp2_strategy_training_step_loader(
    fsdp2_strategy_t* strategy, fsdp2_dataloader_t* loader, int64_t batch_idx,
    const fsdp2_step_options_t* options, fsdp2_step_result_t* result);
/* Collective. As fsdp2_strategy_validation_step on the loader's batch
 * `batch_idx`: its mean loss over the data-parallel ranks into the
 * caller-owned *loss (not NULL). */
FSDP2_API fsdp2_status_t fsdp2_strategy_validation_step_loader(
    fsdp2_strategy_t* strategy, fsdp2_dataloader_t* loader, int64_t batch_idx,
    double* loss);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FSDP2_C_API_FSDP2_H_ */
