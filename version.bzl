"""The one version number of fsdp2.

FSDP2_VERSION names the wheel, the jar, the pkg-config and CMake files and
the installed library (libfsdp2.so.<version>); c_api/fsdp2.h repeats it as
FSDP2_VERSION (reported by fsdp2_version_string()), and
//packaging:version_test checks that the two agree, that its major.minor
is the C ABI's (FSDP2_ABI_VERSION_MAJOR.MINOR: a new ABI minor number makes
a new x.y.0) and that CHANGELOG.md has its section. FSDP2_SOVERSION is the
ABI's major number (FSDP2_ABI_VERSION_MAJOR), the library's soname suffix.
"""

FSDP2_VERSION = "1.9.0"

FSDP2_SOVERSION = "1"
