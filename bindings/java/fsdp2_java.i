/* fsdp2/bindings/java/fsdp2_java.i
 *
 * SWIG interface for the JVM: the C ABI (c_api/fsdp2.h), wrapped as it is,
 * as the internal class org.fsdp2.internal.Fsdp2Native, which the
 * hand-written classes in org.fsdp2 make idiomatic. Every function keeps
 * its C name and parameters; the typemaps below convert
 *  - fsdp2_status_t into void, throwing org.fsdp2.FSDP2Exception with the
 *    status and fsdp2_last_error() (read at once, on the calling thread);
 *  - opaque handles into Java longs;
 *  - out-parameters into Java arrays (one element; written only if the
 *    call succeeded): handles, integers, doubles, names, descriptions of
 *    tensors, and the optimizer state the library allocates (freed here);
 *  - fsdp2_tensor_t from org.fsdp2.Tensor (its direct ByteBuffer is used in
 *    place), batches from Tensor[], (data, size) from byte[], (argc, argv)
 *    from String[];
 *  - option and result structs into proxy classes (AutoCloseable, no
 *    finalizer), whose *_init function sets struct_size.
 * What a typemap refuses (a null batch tensor, an out-array without room)
 * throws a Java exception before the library is called, never an
 * FSDP2Exception, whose message would be a stale fsdp2_last_error().
 *
 * A wrapper returns at once when a typemap throws, without running the
 * freearg typemaps; so the typemaps that acquire memory (strings, batches,
 * argv, byte[]) do it in `check`, after every `in` typemap has run.
 */
%module Fsdp2Native

%{
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "c_api/fsdp2.h"

/* Throws org.fsdp2.FSDP2Exception for a failed call's status. */
static void fsdp2j_throw(JNIEnv* jenv, fsdp2_status_t status) {
  jclass type = (*jenv)->FindClass(jenv, "org/fsdp2/FSDP2Exception");
  jmethodID init;
  jstring name, message;
  jobject error;
  if (type == NULL) return; /* NoClassDefFoundError is pending */
  init = (*jenv)->GetMethodID(jenv, type, "<init>", "(ILjava/lang/String;Ljava/lang/String;)V");
  if (init == NULL) return;
  name = (*jenv)->NewStringUTF(jenv, fsdp2_status_name(status));
  message = (*jenv)->NewStringUTF(jenv, fsdp2_last_error());
  if (name == NULL || message == NULL) return;
  error = (*jenv)->NewObject(jenv, type, init, (jint)status, name, message);
  if (error != NULL) (*jenv)->Throw(jenv, (jthrowable)error);
}

/* Throws a Java exception with a formatted message. */
static void fsdp2j_refuse(JNIEnv* jenv, SWIG_JavaExceptionCodes code, const char* format,
                          const char* what, long long value) {
  char message[256];
  snprintf(message, sizeof(message), format, what, value);
  SWIG_JavaThrowException(jenv, code, message);
}

/* Whether `array` (non-null) can take an out-parameter; throws if not. */
static int fsdp2j_out_array(JNIEnv* jenv, jarray array, jsize length, const char* what) {
  if ((*jenv)->GetArrayLength(jenv, array) >= length) return 1;
  fsdp2j_refuse(jenv, SWIG_JavaIllegalArgumentException,
                "%s: the out-array needs at least %lld elements", what, length);
  return 0;
}

/* A malloc'ed copy of `text`, element `index` of array `what`, or NULL
 * with a Java exception pending. */
static char* fsdp2j_copy_string(JNIEnv* jenv, jstring text, const char* what, int index) {
  const char* chars;
  char* copy;
  if (text == NULL) {
    fsdp2j_refuse(jenv, SWIG_JavaNullPointerException, "%s[%lld] is null", what, index);
    return NULL;
  }
  chars = (*jenv)->GetStringUTFChars(jenv, text, NULL);
  if (chars == NULL) return NULL; /* OutOfMemoryError is pending */
  copy = (char*)malloc(strlen(chars) + 1);
  if (copy != NULL) strcpy(copy, chars);
  (*jenv)->ReleaseStringUTFChars(jenv, text, chars);
  if (copy == NULL) SWIG_JavaThrowException(jenv, SWIG_JavaOutOfMemoryError, what);
  return copy;
}

/* Whether `capacity` bytes hold a shape of `element`-byte values (a shape
 * with a negative size passes: the library refuses it, reading nothing). */
static int fsdp2j_fits(const jlong* dims, jsize ndim, jlong element, jlong capacity) {
  jlong bytes = element;
  jsize d;
  for (d = 0; d < ndim; ++d) {
    if (dims[d] <= 0) return 1;
  }
  for (d = 0; d < ndim; ++d) {
    if (bytes > capacity / dims[d]) return 0;
    bytes *= dims[d];
  }
  return bytes <= capacity;
}

/* Checks a tensor's parts and describes them as `out`. Returns 1, or 0 with a
 * Java exception pending. */
static int fsdp2j_fill(JNIEnv* jenv, jobject buffer, jint dtype, jlongArray shape,
                       const char* what, fsdp2_tensor_t* out) {
  jlong dims[FSDP2_MAX_DIMS];
  jsize ndim, d;
  if (buffer == NULL || shape == NULL) {
    fsdp2j_refuse(jenv, SWIG_JavaNullPointerException, "%s has no buffer or no shape", what, 0);
    return 0;
  }
  ndim = (*jenv)->GetArrayLength(jenv, shape);
  if (ndim > FSDP2_MAX_DIMS) {
    fsdp2j_refuse(jenv, SWIG_JavaIllegalArgumentException,
                  "%s has %lld dimensions; at most FSDP2_MAX_DIMS (8)", what, ndim);
    return 0;
  }
  (*jenv)->GetLongArrayRegion(jenv, shape, 0, ndim, dims);
  memset(out, 0, sizeof(*out));
  out->data = (*jenv)->GetDirectBufferAddress(jenv, buffer);
  out->dtype = dtype;
  out->ndim = ndim;
  for (d = 0; d < ndim; ++d) out->shape[d] = dims[d];
  if (out->data == NULL) {
    fsdp2j_refuse(jenv, SWIG_JavaIllegalArgumentException, "%s: its ByteBuffer is not direct",
                  what, 0);
    return 0;
  }
  if (!fsdp2j_fits(dims, ndim, (jlong)fsdp2_dtype_size(dtype),
                   (*jenv)->GetDirectBufferCapacity(jenv, buffer))) {
    fsdp2j_refuse(jenv, SWIG_JavaIllegalArgumentException,
                  "%s: its buffer is smaller than its shape", what, 0);
    return 0;
  }
  return 1;
}

/* Describes `tensor`, an org.fsdp2.Tensor (its fields buffer, dtype and
 * shape), as `out`: its direct buffer is used in place. Returns 1, or 0
 * with a Java exception pending. */
static int fsdp2j_describe(JNIEnv* jenv, jobject tensor, const char* what, fsdp2_tensor_t* out) {
  jclass type;
  jfieldID buffer_field, dtype_field, shape_field;
  jobject buffer;
  jlongArray shape;
  int ok;
  if (tensor == NULL) {
    fsdp2j_refuse(jenv, SWIG_JavaNullPointerException, "%s is null", what, 0);
    return 0;
  }
  type = (*jenv)->GetObjectClass(jenv, tensor);
  buffer_field = (*jenv)->GetFieldID(jenv, type, "buffer", "Ljava/nio/ByteBuffer;");
  dtype_field = buffer_field ? (*jenv)->GetFieldID(jenv, type, "dtype", "I") : NULL;
  shape_field = dtype_field ? (*jenv)->GetFieldID(jenv, type, "shape", "[J") : NULL;
  (*jenv)->DeleteLocalRef(jenv, type);
  if (shape_field == NULL) return 0; /* NoSuchFieldError is pending */
  buffer = (*jenv)->GetObjectField(jenv, tensor, buffer_field);
  shape = (jlongArray)(*jenv)->GetObjectField(jenv, tensor, shape_field);
  ok = fsdp2j_fill(jenv, buffer, (*jenv)->GetIntField(jenv, tensor, dtype_field), shape, what,
                   out);
  if (buffer != NULL) (*jenv)->DeleteLocalRef(jenv, buffer);
  if (shape != NULL) (*jenv)->DeleteLocalRef(jenv, shape);
  return ok;
}
%}

%include <stdint.i>
%include <enumsimple.swg>
%javaconst(1);

/* The JNI and Java types of C arguments that the `in` typemaps convert. */
%define FSDP2_JAVA(JNI, JAVA, TYPES...)
%typemap(jni) TYPES JNI
%typemap(jtype) TYPES JAVA
%typemap(jstype) TYPES JAVA
%typemap(javain) TYPES "$javainput"
%enddef

/* The `in` half of every out-parameter: a Java array with room for LENGTH
 * values, or null, which passes NULL (the library says whether it may be).
 * The library writes into the typemap's local `value`; the argout typemap
 * copies it out if the call succeeded. */
%define FSDP2_OUT_ARRAY(LENGTH)
  $1 = NULL;
  if ($input != NULL) {
    if (!fsdp2j_out_array(jenv, $input, LENGTH, "$1_name")) return $null;
    $1 = ($1_ltype)&value;
  }
%enddef

/* ---- status -> exception --------------------------------------------------
 * `ret` runs last, after the argout and freearg typemaps: no JNI call
 * follows the throw. */
%typemap(jni) fsdp2_status_t "void"
%typemap(jtype) fsdp2_status_t "void"
%typemap(jstype) fsdp2_status_t "void"
%typemap(javaout) fsdp2_status_t { $jnicall; }
%typemap(out) fsdp2_status_t ""
%typemap(ret) fsdp2_status_t %{
  if ($1 != FSDP2_OK) fsdp2j_throw(jenv, $1);
%}

/* ---- strings: acquired in `check` (see the top) ------------------------ */
%typemap(in) const char* %{ $1 = NULL; %}
%typemap(check) const char* %{
  if ($input != NULL) {
    $1 = ($1_ltype)(*jenv)->GetStringUTFChars(jenv, $input, NULL);
    if ($1 == NULL) return $null; /* OutOfMemoryError is pending */
  }
%}

/* ---- handles: Java longs (the library refuses a value it never made) --- */
%define FSDP2_HANDLE(TYPE)
FSDP2_JAVA("jlong", "long", TYPE*, const TYPE*)
%typemap(in) TYPE*, const TYPE* %{ $1 = ($1_ltype)(intptr_t)$input; %}

FSDP2_JAVA("jlongArray", "long[]", TYPE** out)
%typemap(in) TYPE** out (TYPE* value = NULL) { FSDP2_OUT_ARRAY(1) }
%typemap(argout) TYPE** out %{
  if (result == FSDP2_OK && $input != NULL) {
    jlong handle = (jlong)(intptr_t)value$argnum;
    (*jenv)->SetLongArrayRegion(jenv, $input, 0, 1, &handle);
  }
%}
%enddef
FSDP2_HANDLE(fsdp2_strategy_t)
FSDP2_HANDLE(fsdp2_model_t)
FSDP2_HANDLE(fsdp2_dataloader_t)
FSDP2_HANDLE(fsdp2_unshard_handle_t)

/* ---- scalar out-parameters: every int32_t*, int64_t* and double* in the
 * header is one. */
%define FSDP2_OUT(CTYPE, JNITYPE, JTYPE, JARRAY, SETREGION)
FSDP2_JAVA(JARRAY, "JTYPE[]", CTYPE*)
%typemap(in) CTYPE* (CTYPE value = 0) { FSDP2_OUT_ARRAY(1) }
%typemap(argout) CTYPE* %{
  if (result == FSDP2_OK && $input != NULL) {
    JNITYPE out = (JNITYPE)value$argnum;
    (*jenv)->SETREGION(jenv, $input, 0, 1, &out);
  }
%}
%enddef
FSDP2_OUT(int32_t, jint, int, "jintArray", SetIntArrayRegion)
FSDP2_OUT(int64_t, jlong, long, "jlongArray", SetLongArrayRegion)
FSDP2_OUT(double, jdouble, double, "jdoubleArray", SetDoubleArrayRegion)

/* A borrowed name: String[1]. */
FSDP2_JAVA("jobjectArray", "String[]", const char** name)
%typemap(in) const char** name (const char* value = NULL) { FSDP2_OUT_ARRAY(1) }
%typemap(argout) const char** name %{
  if (result == FSDP2_OK && $input != NULL) {
    jstring text = (*jenv)->NewStringUTF(jenv, value$argnum);
    if (text != NULL) (*jenv)->SetObjectArrayElement(jenv, $input, 0, text);
  }
%}

/* ---- tensors: org.fsdp2.Tensor --------------------------------------------
 * The tensor's buffer is read or written in place during the call (the
 * Tensor, an argument, stays reachable). A null Tensor passes NULL. */
FSDP2_JAVA("jobject", "org.fsdp2.Tensor", fsdp2_tensor_t*, const fsdp2_tensor_t*)
%typemap(in) fsdp2_tensor_t* (fsdp2_tensor_t tensor),
             const fsdp2_tensor_t* (fsdp2_tensor_t tensor) %{
  $1 = NULL;
  if ($input != NULL) {
    if (!fsdp2j_describe(jenv, $input, "$1_name", &tensor)) return $null;
    $1 = &tensor;
  }
%}

/* A batch: Tensor[] (no null elements). */
FSDP2_JAVA("jobjectArray", "org.fsdp2.Tensor[]",
           (const fsdp2_tensor_t* batch, size_t num_tensors))
%typemap(in) (const fsdp2_tensor_t* batch, size_t num_tensors) %{
  $1 = NULL;
  $2 = 0;
%}
%typemap(check) (const fsdp2_tensor_t* batch, size_t num_tensors) %{
  if ($input != NULL) {
    jsize count = (*jenv)->GetArrayLength(jenv, $input), i;
    fsdp2_tensor_t* tensors = (fsdp2_tensor_t*)calloc(count > 0 ? count : 1, sizeof(*tensors));
    if (tensors == NULL) {
      SWIG_JavaThrowException(jenv, SWIG_JavaOutOfMemoryError, "a batch's tensor descriptions");
      return $null;
    }
    for (i = 0; i < count; ++i) {
      char what[32];
      jobject tensor = (*jenv)->GetObjectArrayElement(jenv, $input, i);
      snprintf(what, sizeof(what), "batch[%d]", (int)i);
      if (!fsdp2j_describe(jenv, tensor, what, &tensors[i])) {
        free(tensors);
        return $null;
      }
      (*jenv)->DeleteLocalRef(jenv, tensor);
    }
    $1 = tensors;
    $2 = (size_t)count;
  }
%}
%typemap(freearg) (const fsdp2_tensor_t* batch, size_t num_tensors) %{
  free((void*)$1);
%}

/* What the library describes without data (a parameter's, a prediction's):
 * long[] {dtype, ndim, shape[0], ..., shape[ndim - 1]}, room for
 * 2 + FSDP2_MAX_DIMS values. */
FSDP2_JAVA("jlongArray", "long[]", fsdp2_tensor_t* description)
%typemap(in) fsdp2_tensor_t* description (fsdp2_tensor_t value) {
  memset(&value, 0, sizeof(value));
  FSDP2_OUT_ARRAY(2 + FSDP2_MAX_DIMS)
}
%typemap(argout) fsdp2_tensor_t* description %{
  if (result == FSDP2_OK && $input != NULL) {
    jlong values[2 + FSDP2_MAX_DIMS];
    int d;
    values[0] = value$argnum.dtype;
    values[1] = value$argnum.ndim;
    for (d = 0; d < value$argnum.ndim && d < FSDP2_MAX_DIMS; ++d) {
      values[2 + d] = value$argnum.shape[d];
    }
    (*jenv)->SetLongArrayRegion(jenv, $input, 0, 2 + d, values);
  }
%}
%apply fsdp2_tensor_t* description { fsdp2_tensor_t* info };

/* predict_shape writes only the description of its `output`, while
 * predict_step writes the data of a caller's tensor of the same name.
 * Declared here first, with the parameter named for its typemap; SWIG keeps
 * this declaration and skips the header's identical one. */
fsdp2_status_t fsdp2_strategy_predict_shape(fsdp2_strategy_t* strategy,
                                            const fsdp2_tensor_t* batch, size_t num_tensors,
                                            fsdp2_tensor_t* description);

/* ---- bytes ------------------------------------------------------------- */
FSDP2_JAVA("jbyteArray", "byte[]", (const void* data, size_t size))
%typemap(in) (const void* data, size_t size) %{
  $1 = NULL;
  $2 = 0;
%}
%typemap(check) (const void* data, size_t size) %{
  if ($input != NULL) {
    $1 = (*jenv)->GetByteArrayElements(jenv, $input, NULL);
    if ($1 == NULL) return $null; /* OutOfMemoryError is pending */
    $2 = (size_t)(*jenv)->GetArrayLength(jenv, $input);
  }
%}
%typemap(freearg) (const void* data, size_t size) %{
  if ($1 != NULL) (*jenv)->ReleaseByteArrayElements(jenv, $input, (jbyte*)$1, JNI_ABORT);
%}

/* The library's allocation: byte[1][], freed with fsdp2_free. */
FSDP2_JAVA("jobjectArray", "byte[][]", (void** data, size_t* size))
%typemap(in) (void** data, size_t* size) (void* value = NULL, size_t count = 0) {
  FSDP2_OUT_ARRAY(1)
  $2 = &count;
}
%typemap(argout) (void** data, size_t* size) %{
  if (result == FSDP2_OK && $input != NULL) {
    if (count$argnum > (size_t)INT_MAX) {
      fsdp2j_refuse(jenv, SWIG_JavaIllegalStateException,
                    "%s: %lld bytes do not fit in a Java array", "$1_name",
                    (long long)count$argnum);
    } else {
      jbyteArray array = (*jenv)->NewByteArray(jenv, (jsize)count$argnum);
      if (array != NULL) {
        (*jenv)->SetByteArrayRegion(jenv, array, 0, (jsize)count$argnum,
                                    (const jbyte*)value$argnum);
        (*jenv)->SetObjectArrayElement(jenv, $input, 0, array);
      }
    }
  }
  fsdp2_free(value$argnum);
%}

/* ---- argv: String[] (argv[argc] is NULL) ------------------------------- */
FSDP2_JAVA("jobjectArray", "String[]", (int argc, char** argv))
%typemap(in) (int argc, char** argv) %{
  $1 = 0;
  $2 = NULL;
%}
%typemap(check) (int argc, char** argv) %{
  if ($input != NULL) {
    jsize count = (*jenv)->GetArrayLength(jenv, $input);
    $2 = (char**)calloc((size_t)count + 1, sizeof(char*));
    for (; $2 != NULL && $1 < count; ++$1) {
      jstring arg = (jstring)(*jenv)->GetObjectArrayElement(jenv, $input, $1);
      $2[$1] = fsdp2j_copy_string(jenv, arg, "argv", $1);
      if (arg != NULL) (*jenv)->DeleteLocalRef(jenv, arg);
      if ($2[$1] == NULL) break;
    }
    if ($2 == NULL || $1 < count) {
      if ($2 == NULL) SWIG_JavaThrowException(jenv, SWIG_JavaOutOfMemoryError, "argv");
      $typemap(freearg, (int argc, char** argv))
      return $null;
    }
  }
%}
%typemap(freearg) (int argc, char** argv) %{
  if ($2 != NULL) {
    int i;
    for (i = 0; i < $1; ++i) free($2[i]);
    free($2);
  }
%}

/* ---- option and result structs: proxy classes -----------------------------
 * Created with new, filled by the *_init function (which sets struct_size
 * to the size this wrapper was compiled with), freed by close(). */
%define FSDP2_STRUCT(NAME)
%typemap(javafinalize) struct NAME ""
%typemap(javainterfaces) struct NAME "AutoCloseable"
%typemap(javacode) struct NAME %{
  /** Frees the C struct. */
  @Override
  public void close() {
    delete();
  }
%}
%immutable NAME::struct_size;
%enddef
FSDP2_STRUCT(fsdp2_strategy_options)
FSDP2_STRUCT(fsdp2_optimizer_options)
FSDP2_STRUCT(fsdp2_step_options)
FSDP2_STRUCT(fsdp2_step_result)
FSDP2_STRUCT(fsdp2_token_loader_options)
FSDP2_STRUCT(fsdp2_memory_stats)

/* Described by org.fsdp2.Tensor, freed by the typemaps. */
%ignore fsdp2_tensor;
%ignore fsdp2_free;

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
