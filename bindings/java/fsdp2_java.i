/* fsdp2/bindings/java/fsdp2_java.i
 *
 * SWIG interface for the JVM: the C ABI (c_api/fsdp2.h) as the internal
 * class org.fsdp2.internal.Fsdp2Native, which the hand-written classes in
 * org.fsdp2 wrap (AutoCloseable handles, exceptions, camelCase).
 *
 * C handles cross as Java longs, data as direct ByteBuffers (NIOBUFFER:
 * no copy), shapes and small out-parameters as Java arrays. The header's
 * enumerations become int constants; its functions whose signatures suit
 * Java (errors, version) are wrapped as they are, the rest through the
 * fsdp2j_* helpers below. Every helper returns the fsdp2_status_t; the
 * Java side turns a non-zero status into an FSDP2Exception carrying
 * fsdp2_last_error() (read on the same thread).
 */
%module Fsdp2Native

%{
#include <stdlib.h>
#include <string.h>
#include "c_api/fsdp2.h"

/* A batch under construction: tensors over direct buffers the Java Batch
 * object keeps alive. The Java side checks the 16-tensor capacity and
 * FSDP2_MAX_DIMS before calling, because these helpers cannot set
 * fsdp2_last_error(): their own refusals would carry a stale message. */
typedef struct {
  fsdp2_tensor_t tensors[16];
  size_t count;
} fsdp2j_batch;

/* The optimizer state fetched last on this thread, until copied out. */
static __thread void* fsdp2j_state = NULL;
static __thread size_t fsdp2j_state_size = 0;

static int fsdp2j_describe(fsdp2_tensor_t* t, void* data, int dtype, const long long* shape,
                           int ndim) {
  int d;
  if (ndim < 0 || ndim > FSDP2_MAX_DIMS || (ndim > 0 && shape == NULL)) {
    return FSDP2_ERROR_INVALID_ARGUMENT;
  }
  memset(t, 0, sizeof(*t));
  t->data = data;
  t->dtype = dtype;
  t->ndim = ndim;
  for (d = 0; d < ndim; ++d) t->shape[d] = shape[d];
  return FSDP2_OK;
}
%}

%include <stdint.i>
%include <arrays_java.i>
%include <various.i>
%include <enumsimple.swg>
%javaconst(1);

%apply unsigned char* NIOBUFFER { void* data };
%apply long long[] { long long* shape, long long* out, long long* values };
%apply int[] { int* ints };
%apply double[] { double* doubles };
%apply char** STRING_ARRAY { char** argv };

/* From the header: the enumerations and the functions that suit Java. */
%rename("$ignore", %$isfunction) "";
%rename("$ignore", %$isclass) "";
%rename("%s") fsdp2_last_error;
%rename("%s") fsdp2_status_name;
%rename("%s") fsdp2_abi_version;
%rename("%s") fsdp2_version_string;
%rename("%s") fsdp2_dtype_size;
#define FSDP2_API
%include "c_api/fsdp2.h"
/* The helpers below are all wrapped. */
%rename("%s", regextarget=1, %$isfunction) "^fsdp2j_";

%inline %{
/* ---- handles: out[0] receives the handle as a long ---------------------- */
int fsdp2j_strategy_create(const char* options_json, long long* out) {
  fsdp2_strategy_options_t o;
  fsdp2_strategy_t* s = NULL;
  int status;
  fsdp2_strategy_options_init(&o);
  status = fsdp2_strategy_options_from_json(options_json, &o);
  if (status == FSDP2_OK) status = fsdp2_strategy_create(&o, &s);
  if (status == FSDP2_OK) out[0] = (long long)(intptr_t)s;
  return status;
}
void fsdp2j_strategy_destroy(long long s) { fsdp2_strategy_destroy((fsdp2_strategy_t*)(intptr_t)s); }

int fsdp2j_model_create(const char* config_json, long long* out) {
  fsdp2_model_t* m = NULL;
  int status = fsdp2_model_create(config_json, &m);
  if (status == FSDP2_OK) out[0] = (long long)(intptr_t)m;
  return status;
}
int fsdp2j_model_create_deferred(long long s, const char* config_json, long long* out) {
  fsdp2_model_t* m = NULL;
  int status = fsdp2_model_create_deferred((fsdp2_strategy_t*)(intptr_t)s, config_json, &m);
  if (status == FSDP2_OK) out[0] = (long long)(intptr_t)m;
  return status;
}
int fsdp2j_model_load_torchscript(const char* path, const char* loss, long long* out) {
  fsdp2_model_t* m = NULL;
  int status = fsdp2_model_load_torchscript(path, loss, &m);
  if (status == FSDP2_OK) out[0] = (long long)(intptr_t)m;
  return status;
}
void fsdp2j_model_destroy(long long m) { fsdp2_model_destroy((fsdp2_model_t*)(intptr_t)m); }
/* values[0] = tensors, values[1] = elements */
int fsdp2j_model_num_parameters(long long m, long long* values) {
  int64_t t = 0, e = 0;
  int status = fsdp2_model_num_parameters((fsdp2_model_t*)(intptr_t)m, &t, &e);
  values[0] = t;
  values[1] = e;
  return status;
}

/* ---- strategy ------------------------------------------------------------ */
int fsdp2j_setup_environment(long long s) {
  return fsdp2_strategy_setup_environment((fsdp2_strategy_t*)(intptr_t)s);
}
/* ints = {rank, world_size, dp_rank, dp_size} */
int fsdp2j_rank_info(long long s, int* ints) {
  int32_t v[4] = {0, 0, 0, 0};
  int status = fsdp2_strategy_rank_info((fsdp2_strategy_t*)(intptr_t)s, &v[0], &v[1], &v[2], &v[3]);
  int i;
  for (i = 0; i < 4; ++i) ints[i] = v[i];
  return status;
}
int fsdp2j_connect(long long s, long long m, const char* optimizer_json) {
  fsdp2_optimizer_options_t o;
  int status;
  fsdp2_optimizer_options_init(&o);
  status = fsdp2_optimizer_options_from_json(optimizer_json, &o);
  if (status != FSDP2_OK) return status;
  return fsdp2_strategy_connect((fsdp2_strategy_t*)(intptr_t)s, (fsdp2_model_t*)(intptr_t)m, &o);
}
int fsdp2j_parallelize(long long s) { return fsdp2_strategy_parallelize((fsdp2_strategy_t*)(intptr_t)s); }

/* ---- batches --------------------------------------------------------------- */
long long fsdp2j_batch_new(void) { return (long long)(intptr_t)calloc(1, sizeof(fsdp2j_batch)); }
void fsdp2j_batch_free(long long b) { free((void*)(intptr_t)b); }
/* Adds a tensor over a direct buffer (kept alive by the caller). */
int fsdp2j_batch_add(long long b, void* data, int dtype, long long* shape, int ndim) {
  fsdp2j_batch* batch = (fsdp2j_batch*)(intptr_t)b;
  if (batch == NULL || batch->count >= 16) return FSDP2_ERROR_INVALID_ARGUMENT;
  if (fsdp2j_describe(&batch->tensors[batch->count], data, dtype, shape, ndim) != FSDP2_OK) {
    return FSDP2_ERROR_INVALID_ARGUMENT;
  }
  ++batch->count;
  return FSDP2_OK;
}

/* doubles = {loss, grad_norm, step} */
int fsdp2j_training_step(long long s, long long b, long long batch_idx, int accumulate,
                         double clip, double* doubles) {
  fsdp2j_batch* batch = (fsdp2j_batch*)(intptr_t)b;
  fsdp2_step_options_t o;
  fsdp2_step_result_t r;
  int status;
  fsdp2_step_options_init(&o);
  o.accumulate_grad_batches = accumulate;
  o.gradient_clip_val = clip;
  status = fsdp2_strategy_training_step((fsdp2_strategy_t*)(intptr_t)s, batch->tensors,
                                        batch->count, batch_idx, &o, &r);
  if (status == FSDP2_OK) {
    doubles[0] = r.loss;
    doubles[1] = r.grad_norm;
    doubles[2] = (double)r.step;
  }
  return status;
}
/* test != 0: test_step; doubles[0] = loss */
int fsdp2j_evaluation_step(long long s, long long b, long long batch_idx, int test,
                           double* doubles) {
  fsdp2j_batch* batch = (fsdp2j_batch*)(intptr_t)b;
  double loss = 0;
  int status = test ? fsdp2_strategy_test_step((fsdp2_strategy_t*)(intptr_t)s, batch->tensors,
                                               batch->count, batch_idx, &loss)
                    : fsdp2_strategy_validation_step((fsdp2_strategy_t*)(intptr_t)s,
                                                     batch->tensors, batch->count, batch_idx,
                                                     &loss);
  doubles[0] = loss;
  return status;
}
/* out = {dtype, ndim, shape...} (capacity 2 + FSDP2_MAX_DIMS) */
int fsdp2j_predict_shape(long long s, long long b, long long* out) {
  fsdp2j_batch* batch = (fsdp2j_batch*)(intptr_t)b;
  fsdp2_tensor_t t;
  int d;
  int status = fsdp2_strategy_predict_shape((fsdp2_strategy_t*)(intptr_t)s, batch->tensors,
                                            batch->count, &t);
  if (status != FSDP2_OK) return status;
  out[0] = t.dtype;
  out[1] = t.ndim;
  for (d = 0; d < t.ndim; ++d) out[2 + d] = t.shape[d];
  return status;
}
int fsdp2j_predict_step(long long s, long long b, long long batch_idx, void* data, int dtype,
                        long long* shape, int ndim) {
  fsdp2j_batch* batch = (fsdp2j_batch*)(intptr_t)b;
  fsdp2_tensor_t out;
  if (fsdp2j_describe(&out, data, dtype, shape, ndim) != FSDP2_OK) return FSDP2_ERROR_INVALID_ARGUMENT;
  return fsdp2_strategy_predict_step((fsdp2_strategy_t*)(intptr_t)s, batch->tensors, batch->count,
                                     batch_idx, &out);
}

/* ---- checkpoints, state ----------------------------------------------------- */
int fsdp2j_save_checkpoint(long long s, const char* path) {
  return fsdp2_strategy_save_checkpoint((fsdp2_strategy_t*)(intptr_t)s, path);
}
int fsdp2j_load_checkpoint(long long s, const char* path) {
  return fsdp2_strategy_load_checkpoint((fsdp2_strategy_t*)(intptr_t)s, path);
}
int fsdp2j_remove_checkpoint(long long s, const char* path) {
  return fsdp2_strategy_remove_checkpoint((fsdp2_strategy_t*)(intptr_t)s, path);
}
/* The optimizer state is held by the library until copied out:
 * values[0] = size; then fsdp2j_optimizer_state_copy. */
int fsdp2j_optimizer_state_dict(long long s, long long* values) {
  void* data = NULL;
  size_t size = 0;
  int status = fsdp2_strategy_optimizer_state_dict((fsdp2_strategy_t*)(intptr_t)s, &data, &size);
  if (status != FSDP2_OK) return status;
  fsdp2_free(fsdp2j_state);
  fsdp2j_state = data;
  fsdp2j_state_size = size;
  values[0] = (long long)size;
  return status;
}
/* Copies the state fetched last into `data` (a direct buffer of its size). */
int fsdp2j_optimizer_state_copy(void* data, long long size) {
  if (fsdp2j_state == NULL || (size_t)size != fsdp2j_state_size) return FSDP2_ERROR_INVALID_ARGUMENT;
  memcpy(data, fsdp2j_state, fsdp2j_state_size);
  fsdp2_free(fsdp2j_state);
  fsdp2j_state = NULL;
  fsdp2j_state_size = 0;
  return FSDP2_OK;
}
int fsdp2j_load_optimizer_state_dict(long long s, void* data, long long size) {
  return fsdp2_strategy_load_optimizer_state_dict((fsdp2_strategy_t*)(intptr_t)s, data, (size_t)size);
}
/* ints[0] = pending */
int fsdp2j_has_pending_optimizer_state(long long s, int* ints) {
  int32_t pending = 0;
  int status = fsdp2_strategy_has_pending_optimizer_state((fsdp2_strategy_t*)(intptr_t)s, &pending);
  ints[0] = pending;
  return status;
}
int fsdp2j_num_parameters(long long s, long long* values) {
  int64_t count = 0;
  int status = fsdp2_strategy_num_parameters((fsdp2_strategy_t*)(intptr_t)s, &count);
  values[0] = count;
  return status;
}
/* The name of parameter `index`; ints[0] = the status (NULL unless OK). */
const char* fsdp2j_parameter_name(long long s, long long index, int* ints) {
  const char* name = NULL;
  ints[0] = fsdp2_strategy_parameter_info((fsdp2_strategy_t*)(intptr_t)s, index, &name, NULL);
  return ints[0] == FSDP2_OK ? name : NULL;
}
/* out = {dtype, ndim, shape...} */
int fsdp2j_parameter_shape(long long s, long long index, long long* out) {
  fsdp2_tensor_t t;
  int d;
  int status = fsdp2_strategy_parameter_info((fsdp2_strategy_t*)(intptr_t)s, index, NULL, &t);
  if (status != FSDP2_OK) return status;
  out[0] = t.dtype;
  out[1] = t.ndim;
  for (d = 0; d < t.ndim; ++d) out[2 + d] = t.shape[d];
  return status;
}
int fsdp2j_get_parameter(long long s, const char* name, void* data, int dtype, long long* shape,
                         int ndim) {
  fsdp2_tensor_t t;
  if (fsdp2j_describe(&t, data, dtype, shape, ndim) != FSDP2_OK) return FSDP2_ERROR_INVALID_ARGUMENT;
  return fsdp2_strategy_get_parameter((fsdp2_strategy_t*)(intptr_t)s, name, &t);
}
int fsdp2j_set_parameter(long long s, const char* name, void* data, int dtype, long long* shape,
                         int ndim) {
  fsdp2_tensor_t t;
  if (fsdp2j_describe(&t, data, dtype, shape, ndim) != FSDP2_OK) return FSDP2_ERROR_INVALID_ARGUMENT;
  return fsdp2_strategy_set_parameter((fsdp2_strategy_t*)(intptr_t)s, name, &t);
}
/* values = {epoch, step} */
int fsdp2j_current_epoch_step(long long s, long long* values) {
  int64_t e = 0, st = 0;
  int status = fsdp2_strategy_current_epoch_step((fsdp2_strategy_t*)(intptr_t)s, &e, &st);
  values[0] = e;
  values[1] = st;
  return status;
}
int fsdp2j_set_epoch(long long s, long long epoch) {
  return fsdp2_strategy_set_epoch((fsdp2_strategy_t*)(intptr_t)s, epoch);
}
int fsdp2j_barrier(long long s) { return fsdp2_strategy_barrier((fsdp2_strategy_t*)(intptr_t)s); }
int fsdp2j_teardown(long long s) { return fsdp2_strategy_teardown((fsdp2_strategy_t*)(intptr_t)s); }

/* ---- token loaders ------------------------------------------------------------ */
int fsdp2j_token_loader_create(long long s, const char* path, int token_dtype, long long block_size,
                               long long global_batch_size, double begin_fraction,
                               double end_fraction, long long* out) {
  fsdp2_token_loader_options_t o;
  fsdp2_dataloader_t* l = NULL;
  int status;
  fsdp2_token_loader_options_init(&o);
  o.token_dtype = token_dtype;
  o.block_size = block_size;
  o.global_batch_size = global_batch_size;
  o.begin_fraction = begin_fraction;
  o.end_fraction = end_fraction;
  status = fsdp2_dataloader_create_from_token_file((fsdp2_strategy_t*)(intptr_t)s, path, &o, &l);
  if (status == FSDP2_OK) out[0] = (long long)(intptr_t)l;
  return status;
}
void fsdp2j_loader_destroy(long long l) { fsdp2_dataloader_destroy((fsdp2_dataloader_t*)(intptr_t)l); }
int fsdp2j_loader_num_batches(long long l, long long* values) {
  int64_t n = 0;
  int status = fsdp2_dataloader_num_batches((fsdp2_dataloader_t*)(intptr_t)l, &n);
  values[0] = n;
  return status;
}
int fsdp2j_loader_set_epoch(long long l, long long epoch) {
  return fsdp2_dataloader_set_epoch((fsdp2_dataloader_t*)(intptr_t)l, epoch);
}
int fsdp2j_training_step_loader(long long s, long long l, long long batch_idx, int accumulate,
                                double clip, double* doubles) {
  fsdp2_step_options_t o;
  fsdp2_step_result_t r;
  int status;
  fsdp2_step_options_init(&o);
  o.accumulate_grad_batches = accumulate;
  o.gradient_clip_val = clip;
  status = fsdp2_strategy_training_step_loader((fsdp2_strategy_t*)(intptr_t)s,
                                               (fsdp2_dataloader_t*)(intptr_t)l, batch_idx, &o, &r);
  if (status == FSDP2_OK) {
    doubles[0] = r.loss;
    doubles[1] = r.grad_norm;
    doubles[2] = (double)r.step;
  }
  return status;
}
int fsdp2j_validation_step_loader(long long s, long long l, long long batch_idx, double* doubles) {
  double loss = 0;
  int status = fsdp2_strategy_validation_step_loader((fsdp2_strategy_t*)(intptr_t)s,
                                                     (fsdp2_dataloader_t*)(intptr_t)l, batch_idx,
                                                     &loss);
  doubles[0] = loss;
  return status;
}

/* ---- launching ------------------------------------------------------------------- */
/* ints[0] = is_rank */
int fsdp2j_is_rank_process(int* ints) {
  int32_t r = 0;
  int status = fsdp2_is_rank_process(&r);
  ints[0] = r;
  return status;
}
/* argv: the full command line (NULL-terminated by SWIG); ints[0] = exit code */
int fsdp2j_launch_local(int nproc, int threads_per_rank, char** argv, int* ints) {
  int argc = 0;
  int32_t code = 1;
  int status;
  while (argv != NULL && argv[argc] != NULL) ++argc;
  status = fsdp2_launch_local(nproc, threads_per_rank, argc, argv, &code);
  ints[0] = code;
  return status;
}
%}
