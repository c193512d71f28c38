/* One pass over a field's used bytes: the copy (where there is one), the value check and
 * the protocol's checksum together. shared/memory/row_pass.py is its one caller and says
 * what each part guards; docs/design.md#passes-over-a-row says why one pass.
 *
 * A C extension, not numba: a process's first call of a numba kernel cost 0.6-2 s of CPU
 * (numba's typing registries, its import of scipy.linalg) in every stager and pool, even
 * with the kernel cached; this loads in a millisecond. The lanes are independent, so the
 * compiler vectorizes the loops over them; built by gcc on x86-64 glibc, the hot loop is
 * also built for AVX2 and AVX-512 and the loader picks the host's (target_clones; other
 * compilers and platforms get their baseline's vector units).
 *
 * The checksum: 64 lanes of 32-bit FNV-1a, word i (native order) into lane i % 64, the
 * bytes past the last whole word into lane 0, the lanes then the byte count folded into
 * 64 bits of FNV-1a. The check: FLOAT32, every word's bits with the sign cleared at most
 * `limit` (finite and within +-MAX_ABS); TOKENS, every word an int32 in [0, limit). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define LANES 64
#define FNV32_BASIS 2166136261u
#define FNV32_PRIME 16777619u
#define FNV64_BASIS 14695981039346656037ull
#define FNV64_PRIME 1099511628211ull

enum { PLAIN = 0, TOKENS = 1, FLOAT32 = 2 };

/* The clones need ifunc: glibc's (not musl's, not macOS's). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__GLIBC__)
#define HOST_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define HOST_CLONES
#endif

/* Fills *hash and returns whether the values pass. dst is NULL or holds n bytes. */
HOST_CLONES static int
one_pass(const uint8_t *src, uint8_t *dst, Py_ssize_t n, int kind, long long limit,
         uint64_t *hash)
{
    uint32_t h[LANES], top[LANES], w[LANES];
    int32_t low[LANES];
    for (int j = 0; j < LANES; j++) {
        h[j] = FNV32_BASIS + (uint32_t)j;
        top[j] = 0;
        low[j] = 0;
    }
    const Py_ssize_t n_words = n / 4, blocks = n_words / LANES;
    for (Py_ssize_t i = 0; i < blocks; i++) {
        const Py_ssize_t at = i * LANES * 4;
        memcpy(w, src + at, sizeof w);
        if (dst)
            memcpy(dst + at, w, sizeof w);
        if (kind == FLOAT32) {
            for (int j = 0; j < LANES; j++) {
                const uint32_t b = w[j] & 0x7FFFFFFFu;
                top[j] = b > top[j] ? b : top[j];
            }
        } else if (kind == TOKENS) {
            for (int j = 0; j < LANES; j++) {
                const int32_t v = (int32_t)w[j];
                low[j] = v < low[j] ? v : low[j];
                top[j] = v > (int32_t)top[j] ? w[j] : top[j];
            }
        }
        for (int j = 0; j < LANES; j++)
            h[j] = (h[j] ^ w[j]) * FNV32_PRIME;
    }
    for (Py_ssize_t i = blocks * LANES; i < n_words; i++) { /* past the last whole block */
        uint32_t x;
        memcpy(&x, src + i * 4, 4);
        if (dst)
            memcpy(dst + i * 4, &x, 4);
        const int j = (int)(i % LANES);
        if (kind == FLOAT32) {
            const uint32_t b = x & 0x7FFFFFFFu;
            top[j] = b > top[j] ? b : top[j];
        } else if (kind == TOKENS) {
            const int32_t v = (int32_t)x;
            low[j] = v < low[j] ? v : low[j];
            top[j] = v > (int32_t)top[j] ? x : top[j];
        }
        h[j] = (h[j] ^ x) * FNV32_PRIME;
    }
    for (Py_ssize_t i = n_words * 4; i < n; i++) { /* past the last whole word */
        if (dst)
            dst[i] = src[i];
        h[0] = (h[0] ^ (uint32_t)src[i]) * FNV32_PRIME;
    }
    uint64_t acc = FNV64_BASIS;
    int ok = 1;
    for (int j = 0; j < LANES; j++) {
        acc = (acc ^ (uint64_t)h[j]) * FNV64_PRIME;
        if (kind == FLOAT32)
            ok &= (long long)top[j] <= limit;
        else if (kind == TOKENS)
            ok &= low[j] >= 0 && (long long)(int32_t)top[j] < limit;
    }
    *hash = (acc ^ (uint64_t)n) * FNV64_PRIME;
    return ok;
}

static int
kind_known(int kind)
{
    if (kind == PLAIN || kind == TOKENS || kind == FLOAT32)
        return 1;
    PyErr_Format(PyExc_ValueError, "row pass: kind %d is none of PLAIN, TOKENS, FLOAT32", kind);
    return 0;
}

PyDoc_STRVAR(field_doc,
"field(src, dst, kind, limit) -> (hash, ok)\n\n"
"src: the used bytes of one field (any C-contiguous buffer, read-only allowed); dst: None,\n"
"or a writable buffer of at least as many bytes, which they are copied into.");

static PyObject *
field(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer src, dst = {0};
    PyObject *dst_obj;
    int kind;
    long long limit;
    if (!PyArg_ParseTuple(args, "y*OiL", &src, &dst_obj, &kind, &limit))
        return NULL;
    uint8_t *out = NULL;
    if (dst_obj != Py_None) {
        if (PyObject_GetBuffer(dst_obj, &dst, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
            PyBuffer_Release(&src);
            return NULL;
        }
        if (dst.len < src.len) {
            PyErr_Format(PyExc_ValueError, "row pass: %zd bytes do not fit a place of %zd",
                         src.len, dst.len);
            PyBuffer_Release(&dst);
            PyBuffer_Release(&src);
            return NULL;
        }
        out = dst.buf;
    }
    if (!kind_known(kind)) {
        if (out)
            PyBuffer_Release(&dst);
        PyBuffer_Release(&src);
        return NULL;
    }
    uint64_t hash;
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = one_pass(src.buf, out, src.len, kind, limit, &hash);
    Py_END_ALLOW_THREADS
    if (out)
        PyBuffer_Release(&dst);
    PyBuffer_Release(&src);
    return Py_BuildValue("KO", (unsigned long long)hash, ok ? Py_True : Py_False);
}

/* A buffer of n items of one C type, with its format checked: formats, the type's
 * characters (struct module codes) that may stand for it on this platform. */
static int
typed(PyObject *obj, Py_buffer *view, int writable, const char *formats, Py_ssize_t itemsize,
      const char *what)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0)
        return 0;
    const char *f = view->format ? view->format : "B";
    if (*f == '<' || *f == '=' || *f == '@')
        f++;
    if (view->itemsize != itemsize || f[0] == '\0' || f[1] != '\0' || !strchr(formats, f[0])) {
        PyErr_Format(PyExc_TypeError, "row pass: %s must be %s, not format '%s' of %zd bytes",
                     what, formats[0] == 'q' ? "int64" : formats[0] == 'Q' ? "uint64" : "bool",
                     view->format ? view->format : "B", view->itemsize);
        PyBuffer_Release(view);
        return 0;
    }
    return 1;
}

PyDoc_STRVAR(rows_doc,
"rows(fields, row_bytes, rows, used, kind, limit, hashes, ok) -> None\n\n"
"The pass over some rows of a batch where they lie: fields, the rows' bytes (row r at\n"
"r * row_bytes); rows and used, int64 (which rows, their used bytes); hashes (uint64) and\n"
"ok (bool), one each per row, filled.");

static PyObject *
rows(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *which_obj, *used_obj, *hashes_obj, *ok_obj;
    Py_buffer fields, which = {0}, used = {0}, hashes = {0}, ok = {0};
    Py_ssize_t row_bytes;
    int kind;
    long long limit;
    if (!PyArg_ParseTuple(args, "y*nOOiLOO", &fields, &row_bytes, &which_obj, &used_obj, &kind,
                          &limit, &hashes_obj, &ok_obj))
        return NULL;
    int fits = kind_known(kind) && typed(which_obj, &which, 0, "ql", 8, "rows");
    fits = fits && typed(used_obj, &used, 0, "ql", 8, "used");
    fits = fits && typed(hashes_obj, &hashes, 1, "QL", 8, "hashes");
    fits = fits && typed(ok_obj, &ok, 1, "?", 1, "ok");
    const Py_ssize_t n = which.len / 8;
    if (fits && (used.len != n * 8 || hashes.len != n * 8 || ok.len != n)) {
        PyErr_SetString(PyExc_ValueError,
                        "row pass: rows and used (int64), hashes (uint64), ok (bool) must "
                        "be one each per row");
        fits = 0;
    }
    if (fits && row_bytes < 0) {
        PyErr_Format(PyExc_ValueError, "row pass: rows of %zd bytes", row_bytes);
        fits = 0;
    }
    Py_ssize_t bad = -1;
    int64_t bad_row = 0, bad_used = 0;
    if (fits) {
        /* Each row's index and length are read once, into locals, checked and used: the
         * caller's arrays may overlap the hashes written here, or change under us. */
        const Py_ssize_t n_rows = row_bytes ? fields.len / row_bytes : PY_SSIZE_T_MAX;
        const uint8_t *base = fields.buf, *at = which.buf, *length = used.buf;
        uint8_t *hash_at = hashes.buf, *good = ok.buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t r, u;
            uint64_t hash;
            memcpy(&r, at + i * 8, 8);
            memcpy(&u, length + i * 8, 8);
            if (r < 0 || r >= n_rows || u < 0 || u > row_bytes) {
                bad = i, bad_row = r, bad_used = u;
                break;
            }
            good[i] = (uint8_t)one_pass(base + r * row_bytes, NULL, u, kind, limit, &hash);
            memcpy(hash_at + i * 8, &hash, 8);
        }
        Py_END_ALLOW_THREADS
        if (bad >= 0) {
            PyErr_Format(PyExc_ValueError,
                         "row pass: row %lld, %lld bytes, is outside %zd rows of %zd bytes",
                         (long long)bad_row, (long long)bad_used, row_bytes ? n_rows : 0,
                         row_bytes);
            fits = 0;
        }
    }
    if (ok.obj)
        PyBuffer_Release(&ok);
    if (hashes.obj)
        PyBuffer_Release(&hashes);
    if (used.obj)
        PyBuffer_Release(&used);
    if (which.obj)
        PyBuffer_Release(&which);
    PyBuffer_Release(&fields);
    if (!fits)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"field", field, METH_VARARGS, field_doc},
    {"rows", rows, METH_VARARGS, rows_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_row_pass", "shared/memory/row_pass.py's one pass, in C.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__row_pass(void)
{
    return PyModule_Create(&module);
}
