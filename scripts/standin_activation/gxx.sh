# gxx_linux-64 (conda-forge's ctng-compiler-activation): CXX, GXX and conda-forge's default CXXFLAGS.
for _t in @TOOLS@; do export "$(echo "$_t" | tr 'a-z+-' 'A-ZX_')=$_standin/bin/@TRIPLET@-$_t"; done
export CXXFLAGS="${CXXFLAGS:--fvisibility-inlines-hidden -std=c++17 -fmessage-length=0 -march=nocona -mtune=haswell -ftree-vectorize -fPIC -fstack-protector-strong -fno-plt -O2 -ffunction-sections -pipe -isystem ${_p}/include -fdebug-prefix-map=${SRC_DIR}=/usr/local/src/conda/${PKG_NAME}-${PKG_VERSION} -fdebug-prefix-map=${_p}=/usr/local/src/conda-prefix}"
