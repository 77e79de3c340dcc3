# gcc_linux-64 (conda-forge's ctng-compiler-activation): the tool variables and conda-forge's default flags.
export HOST=@TRIPLET@ host_alias=@TRIPLET@
for _t in @TOOLS@; do export "$(echo "$_t" | tr 'a-z+-' 'A-ZX_')=$_standin/bin/@TRIPLET@-$_t"; done
export CPPFLAGS="${CPPFLAGS:--DNDEBUG -D_FORTIFY_SOURCE=2 -O2 -isystem ${_p}/include}"
export CFLAGS="${CFLAGS:--march=nocona -mtune=haswell -ftree-vectorize -fPIC -fstack-protector-strong -fno-plt -O2 -ffunction-sections -pipe -isystem ${_p}/include -fdebug-prefix-map=${SRC_DIR}=/usr/local/src/conda/${PKG_NAME}-${PKG_VERSION} -fdebug-prefix-map=${_p}=/usr/local/src/conda-prefix}"
export LDFLAGS="${LDFLAGS:--Wl,-O2 -Wl,--sort-common -Wl,--as-needed -Wl,-z,relro -Wl,-z,now -Wl,--disable-new-dtags -Wl,--gc-sections -Wl,-rpath,${_p}/lib -Wl,-rpath-link,${_p}/lib -L${_p}/lib}"
