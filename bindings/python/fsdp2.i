/* fsdp2/bindings/python/fsdp2.i
 *
 * SWIG interface: the C ABI (c_api/fsdp2.h) as the private Python module
 * fsdp2.fsdp2_c over the C extension fsdp2._fsdp2_c. (Not "_fsdp2_c": SWIG
 * would name the extension "__fsdp2_c", which Python mangles inside the
 * generated class bodies.) The hand-written package (fsdp2/__init__.py) is
 * what users import; this layer only converts:
 *  - every fsdp2_status_t into an exception built by the package's factory
 *    (fsdp2.Error subclasses carrying fsdp2_last_error()),
 *  - out-parameters (handles, counts, results) into return values,
 *  - sequences of buffer-protocol objects (numpy arrays) into
 *    fsdp2_tensor_t batches, and writable arrays into output buffers,
 *  - bytes into (data, size) and lists of str into (argc, argv).
 * Generated with -threads: every C call runs without the GIL.
 */
%module(package="fsdp2") fsdp2_c

%{
#define SWIG_FILE_WITH_INIT
#include <Python.h>
#include <string.h>
#include "c_api/fsdp2.h"

static PyObject* fsdp2py_error_factory = NULL;

/* Raises the package's exception for `status` (GIL held). */
static void fsdp2py_raise(fsdp2_status_t status) {
  const char* message = fsdp2_last_error();
  if (fsdp2py_error_factory != NULL) {
    PyObject* error = PyObject_CallFunction(fsdp2py_error_factory, "iss", (int)status,
                                            fsdp2_status_name(status), message);
    if (error != NULL) {
      PyErr_SetObject((PyObject*)Py_TYPE(error), error);
      Py_DECREF(error);
    }
    return;
  }
  PyErr_Format(PyExc_RuntimeError, "%s: %s", fsdp2_status_name(status), message);
}

/* The fsdp2 dtype of a buffer's struct format, or -1. */
static int fsdp2py_dtype(const Py_buffer* view) {
  const char* f = view->format ? view->format : "B";
  if (*f == '<' || *f == '=' || *f == '@') ++f;
  if (f[0] == '\0' || f[1] != '\0') return -1;
  switch (f[0]) {
    case 'f': return FSDP2_DTYPE_FLOAT32;
    case 'd': return FSDP2_DTYPE_FLOAT64;
    case 'e': return FSDP2_DTYPE_FLOAT16;
    case 'i': return view->itemsize == 4 ? FSDP2_DTYPE_INT32 : -1;
    case 'l': case 'q': return view->itemsize == 8 ? FSDP2_DTYPE_INT64 : -1;
    case 'B': return FSDP2_DTYPE_UINT8;
    case 'H': return FSDP2_DTYPE_UINT16;
  }
  return -1;
}

/* Describes `obj` (a C-contiguous buffer) as a tensor; keeps the view in
 * `view` until fsdp2py_release. Returns 0 or -1 with a Python error set. */
static int fsdp2py_describe(PyObject* obj, int writable, Py_buffer* view, fsdp2_tensor_t* t,
                            const char* what) {
  int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
  int d;
  if (PyObject_GetBuffer(obj, view, flags) != 0) {
    PyErr_Format(PyExc_TypeError,
                 "%s must be a C-contiguous%s array (numpy.ascontiguousarray), got %s", what,
                 writable ? ", writable" : "", Py_TYPE(obj)->tp_name);
    return -1;
  }
  memset(t, 0, sizeof(*t));
  t->dtype = fsdp2py_dtype(view);
  if (t->dtype < 0) {
    PyErr_Format(PyExc_TypeError, "%s has element format '%s', which fsdp2 does not take "
                 "(float32/64, float16, int32, int64, uint8)", what,
                 view->format ? view->format : "B");
    PyBuffer_Release(view);
    return -1;
  }
  if (view->ndim > FSDP2_MAX_DIMS) {
    PyErr_Format(PyExc_ValueError, "%s has %d dimensions; at most %d", what, view->ndim,
                 FSDP2_MAX_DIMS);
    PyBuffer_Release(view);
    return -1;
  }
  t->data = view->buf;
  t->ndim = view->ndim;
  for (d = 0; d < view->ndim; ++d) t->shape[d] = view->shape[d];
  return 0;
}

/* A borrowed batch: the tensors and the buffer views behind them. */
typedef struct {
  fsdp2_tensor_t* tensors;
  Py_buffer* views;
  size_t count;
} fsdp2py_batch;

static void fsdp2py_batch_release(fsdp2py_batch* b) {
  size_t i;
  for (i = 0; i < b->count; ++i) PyBuffer_Release(&b->views[i]);
  free(b->tensors);
  free(b->views);
  b->tensors = NULL;
  b->views = NULL;
  b->count = 0;
}

static int fsdp2py_batch_from(PyObject* seq, fsdp2py_batch* b) {
  PyObject* fast = PySequence_Fast(seq, "a batch must be a sequence of arrays");
  Py_ssize_t n, i;
  b->tensors = NULL;
  b->views = NULL;
  b->count = 0;
  if (fast == NULL) return -1;
  n = PySequence_Fast_GET_SIZE(fast);
  b->tensors = calloc(n > 0 ? n : 1, sizeof(fsdp2_tensor_t));
  b->views = calloc(n > 0 ? n : 1, sizeof(Py_buffer));
  for (i = 0; i < n; ++i) {
    char what[32];
    snprintf(what, sizeof(what), "batch[%d]", (int)i);
    if (fsdp2py_describe(PySequence_Fast_GET_ITEM(fast, i), 0, &b->views[i], &b->tensors[i],
                         what) != 0) {
      fsdp2py_batch_release(b);
      Py_DECREF(fast);
      return -1;
    }
    b->count = (size_t)(i + 1);
  }
  Py_DECREF(fast);
  return 0;
}
%}

%include <stdint.i>
%include <typemaps.i>
%include <argcargv.i>

/* ---- status -> exception ---------------------------------------------- */
%typemap(out) fsdp2_status_t {
  if ($1 != FSDP2_OK) {
    fsdp2py_raise($1);
    SWIG_fail;
  }
  $result = SWIG_Py_Void();
}

/* ---- handle out-parameters -> return values ---------------------------- */
%define FSDP2_OUT_HANDLE(TYPE)
%typemap(in, numinputs=0) TYPE** out (TYPE* temp = NULL) { $1 = &temp; }
%typemap(argout) TYPE** out {
  $result = SWIG_Python_AppendOutput($result, SWIG_NewPointerObj(*$1, $descriptor(TYPE*), 0));
}
%enddef
FSDP2_OUT_HANDLE(fsdp2_strategy_t)
FSDP2_OUT_HANDLE(fsdp2_model_t)
FSDP2_OUT_HANDLE(fsdp2_dataloader_t)
FSDP2_OUT_HANDLE(fsdp2_unshard_handle_t)

/* ---- scalar out-parameters ---------------------------------------------- */
%apply int32_t* OUTPUT { int32_t* rank, int32_t* world_size, int32_t* data_parallel_rank,
                         int32_t* data_parallel_size, int32_t* pending, int32_t* exit_code,
                         int32_t* is_rank, int32_t* in_flight, int32_t* restart_count };
%apply int64_t* OUTPUT { int64_t* count, int64_t* num_tensors, int64_t* num_elements,
                         int64_t* epoch, int64_t* step };
%apply double* OUTPUT { double* loss };

%typemap(in, numinputs=0) fsdp2_step_result_t* result (fsdp2_step_result_t temp) {
  memset(&temp, 0, sizeof(temp));
  $1 = &temp;
}
%typemap(argout) fsdp2_step_result_t* result {
  $result = SWIG_Python_AppendOutput(
      $result, Py_BuildValue("(ddL)", $1->loss, $1->grad_norm, (long long)$1->step));
}

/* ---- batches: a sequence of arrays ------------------------------------- */
%typemap(in) (const fsdp2_tensor_t* batch, size_t num_tensors) (fsdp2py_batch temp = {NULL, NULL, 0}) {
  if (fsdp2py_batch_from($input, &temp) != 0) SWIG_fail;
  $1 = temp.tensors;
  $2 = temp.count;
}
%typemap(freearg) (const fsdp2_tensor_t* batch, size_t num_tensors) {
  fsdp2py_batch_release(&temp$argnum);
}

/* ---- a writable output array ------------------------------------------- */
%typemap(in) fsdp2_tensor_t* value (Py_buffer view, fsdp2_tensor_t t, int have = 0),
             fsdp2_tensor_t* output (Py_buffer view, fsdp2_tensor_t t, int have = 0) {
  if (fsdp2py_describe($input, 1, &view, &t, "$1_name") != 0) SWIG_fail;
  have = 1;
  $1 = &t;
}
%typemap(freearg) fsdp2_tensor_t* value, fsdp2_tensor_t* output {
  if (have$argnum) PyBuffer_Release(&view$argnum);
}
/* A read-only input array. */
%typemap(in) const fsdp2_tensor_t* value (Py_buffer view, fsdp2_tensor_t t, int have = 0) {
  if (fsdp2py_describe($input, 0, &view, &t, "value") != 0) SWIG_fail;
  have = 1;
  $1 = &t;
}
%typemap(freearg) const fsdp2_tensor_t* value {
  if (have$argnum) PyBuffer_Release(&view$argnum);
}

/* ---- bytes in ------------------------------------------------------------ */
%typemap(in) (const void* data, size_t size) (Py_buffer view, int have = 0) {
  if (PyObject_GetBuffer($input, &view, PyBUF_C_CONTIGUOUS) != 0) {
    PyErr_SetString(PyExc_TypeError, "expected bytes");
    SWIG_fail;
  }
  have = 1;
  $1 = view.buf;
  $2 = (size_t)view.len;
}
%typemap(freearg) (const void* data, size_t size) {
  if (have$argnum) PyBuffer_Release(&view$argnum);
}

/* ---- argv --------------------------------------------------------------- */
%apply (int ARGC, char** ARGV) { (int argc, char** argv) }

/* Replaced by the helpers below, which return what they find. */
%ignore fsdp2_strategy_predict_shape;
%ignore fsdp2_strategy_parameter_info;
%ignore fsdp2_strategy_optimizer_state_dict;
%ignore fsdp2_free;
%ignore fsdp2_tensor;
%ignore fsdp2_tensor_t;

/* Helpers that use the Python API run with the GIL held. */
%nothread fsdp2py_set_error_factory;
%nothread fsdp2py_predict_shape;
%nothread fsdp2py_parameter_info;
%nothread fsdp2py_optimizer_state_dict;

%inline %{
/* The package registers a callable(status, name, message) -> exception. */
PyObject* fsdp2py_set_error_factory(PyObject* factory) {
  Py_XINCREF(factory);
  Py_XDECREF(fsdp2py_error_factory);
  fsdp2py_error_factory = factory;
  Py_RETURN_NONE;
}

/* (dtype, shape) of predict_step's output for `batch`. */
PyObject* fsdp2py_predict_shape(fsdp2_strategy_t* strategy, PyObject* batch) {
  fsdp2py_batch b;
  fsdp2_tensor_t out;
  fsdp2_status_t status;
  PyObject* shape;
  int d;
  if (fsdp2py_batch_from(batch, &b) != 0) return NULL;
  Py_BEGIN_ALLOW_THREADS
  status = fsdp2_strategy_predict_shape(strategy, b.tensors, b.count, &out);
  Py_END_ALLOW_THREADS
  fsdp2py_batch_release(&b);
  if (status != FSDP2_OK) {
    fsdp2py_raise(status);
    return NULL;
  }
  shape = PyTuple_New(out.ndim);
  for (d = 0; d < out.ndim; ++d) PyTuple_SET_ITEM(shape, d, PyLong_FromLongLong(out.shape[d]));
  return Py_BuildValue("(iN)", (int)out.dtype, shape);
}

/* (name, dtype, shape) of parameter `index`. */
PyObject* fsdp2py_parameter_info(fsdp2_strategy_t* strategy, int64_t index) {
  const char* name = NULL;
  fsdp2_tensor_t info;
  PyObject* shape;
  int d;
  fsdp2_status_t status = fsdp2_strategy_parameter_info(strategy, index, &name, &info);
  if (status != FSDP2_OK) {
    fsdp2py_raise(status);
    return NULL;
  }
  shape = PyTuple_New(info.ndim);
  for (d = 0; d < info.ndim; ++d) PyTuple_SET_ITEM(shape, d, PyLong_FromLongLong(info.shape[d]));
  return Py_BuildValue("(siN)", name, (int)info.dtype, shape);
}

/* This rank's optimizer state as bytes. */
PyObject* fsdp2py_optimizer_state_dict(fsdp2_strategy_t* strategy) {
  void* data = NULL;
  size_t size = 0;
  PyObject* result;
  fsdp2_status_t status;
  Py_BEGIN_ALLOW_THREADS
  status = fsdp2_strategy_optimizer_state_dict(strategy, &data, &size);
  Py_END_ALLOW_THREADS
  if (status != FSDP2_OK) {
    fsdp2py_raise(status);
    return NULL;
  }
  result = PyBytes_FromStringAndSize((const char*)data, (Py_ssize_t)size);
  fsdp2_free(data);
  return result;
}
%}

#define FSDP2_API
// The strategy options' strings are set through
// fsdp2_strategy_options_from_json (the library keeps those strings); a
// SWIG setter would copy into memory that nobody frees.
%immutable fsdp2_strategy_options::ignored_params;
%immutable fsdp2_strategy_options::forward_prefetch_modules;
%immutable fsdp2_strategy_options::backward_prefetch_modules;
%immutable fsdp2_strategy_options::frozen_params;
%immutable fsdp2_strategy_options::profile_path;
%include "c_api/fsdp2.h"
