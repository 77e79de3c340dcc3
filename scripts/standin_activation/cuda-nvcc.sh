# cuda-nvcc_linux-64 (conda-forge's cuda-nvcc-feedstock): the CUDA headers and libraries of the host (and
# build) prefix on every compile and link line, and nvcc's host compiler set to $CXX.
if [ "${CONDA_BUILD:-0}" = "1" ]; then
  _inc="-I${PREFIX}/@TARGET@/include -I${BUILD_PREFIX}/@TARGET@/include"
  _lib="-L${PREFIX}/@TARGET@/lib -L${PREFIX}/@TARGET@/lib/stubs -L${BUILD_PREFIX}/@TARGET@/lib -L${BUILD_PREFIX}/@TARGET@/lib/stubs"
  export NVCC_APPEND_FLAGS="${NVCC_APPEND_FLAGS} -I${PREFIX}/@TARGET@/include -L${PREFIX}/@TARGET@/lib -L${PREFIX}/@TARGET@/lib/stubs"
else
  _inc="-I${CONDA_PREFIX}/@TARGET@/include"
  _lib="-L${CONDA_PREFIX}/@TARGET@/lib -L${CONDA_PREFIX}/@TARGET@/lib/stubs"
fi
export CFLAGS="${CFLAGS} ${_inc}" CPPFLAGS="${CPPFLAGS} ${_inc}" CXXFLAGS="${CXXFLAGS} ${_inc}" LDFLAGS="${LDFLAGS} ${_lib}"
if [ -z "${CXX+x}" ]; then
  echo 'cuda-nvcc: Please add the `compiler("c")` and `compiler("cxx")` packages to the environment.'
  false
else
  export NVCC_PREPEND_FLAGS="${NVCC_PREPEND_FLAGS} -ccbin=${CXX}"
fi
