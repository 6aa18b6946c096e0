/* loadr._jpegregion: decode only a region of a JPEG, at a DCT scale, and resample it.
 *
 * simplejpeg and Pillow decode whole images; a random resized crop keeps about half of
 * one. libjpeg-turbo's partial decompression skips the inverse DCT, upsampling and colour
 * conversion outside the region (jpeg_crop_scanline, jpeg_skip_scanlines): only the
 * Huffman decoding of the rows outside the region stays.
 *
 * decode_region(data, denom, top, height, left, width, channels[, to_end]) -> (bytes, h, w, x)
 *   data: the JPEG (any buffer); denom: 1, 2, 4 or 8 (libjpeg's scale_denom);
 *   top, height, left, width: the region in the coordinates of the image at 1/denom;
 *   channels: 1 (L) or 3 (RGB); to_end (default 1): Huffman-decode the rows below the
 *   region too and read on to the EOI marker, so that a file damaged anywhere is refused
 *   as a whole-image decoder refuses it (0: stop after the region's last row).
 * Returns the rows top..top+height (exactly) and the columns x..x+w, which cover
 * left..left+width: libjpeg widens a crop to iMCU boundaries, so x <= left.
 * A file libjpeg cannot decode raises ValueError, and so does one it would only warn
 * about (corrupt or truncated data), as simplejpeg (strict) does. Nothing is printed.
 *
 * resample(src, h, w, channels, (y0, y1), (x0, x1), (out_h, out_w)) -> bytes
 *   An antialiased bilinear resize of the box (Pillow's filter and fixed point, vertical
 *   pass first), mirrored by loadr.decode's numpy twin: the same bytes without this module.
 * decode_resize(data, denom, top, height, left, width, channels, ybox, xbox, out[, flip])
 *   -> bytes
 *   The two in one call, on the region as decoded; flip: mirrored left-right (the columns
 *   written in reverse order: a flip after the resize without a copy of its own).
 * simd([on]) -> bool
 *   Whether the resize runs its AVX2 passes (where the CPU has AVX2) rather than its
 *   portable ones; the same bytes either way (the tests run both).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <stdio.h>
#include <string.h>
#include <jpeglib.h>
/* The entropy decoder's decode_mcu and the crop's iMCU columns. Debian's libjpeg-dev
 * installs jpegint.h; upstream libjpeg-turbo does not: without it, libjpeg stores the
 * coefficients of the MCUs outside the crop's columns too (the same pixels, ~1% slower). */
#if defined(__has_include)
#if __has_include(<jpegint.h>)
#include <jpegint.h>
#define HAVE_JPEGINT 1
#endif
#endif
#include <math.h>

/* Partial decompression is libjpeg-turbo's, not IJG libjpeg's: with another libjpeg the
 * build fails here and setup.py's optional=True leaves the module out (tested: 2.1.5). */
#ifndef LIBJPEG_TURBO_VERSION_NUMBER
#error "loadr._jpegregion needs libjpeg-turbo (jpeg_crop_scanline, jpeg_skip_scanlines)"
#endif

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
} error_mgr;

/* libjpeg's default error_exit calls exit(): jump back to the phase that called it. */
static void error_exit(j_common_ptr cinfo) {
    error_mgr *err = (error_mgr *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

/* A warning (level -1: corrupt data, a premature end) is an error here; trace messages
 * (level >= 0) are dropped rather than printed. */
static void emit_message(j_common_ptr cinfo, int level) {
    if (level < 0)
        error_exit(cinfo);
}

typedef struct {
    struct jpeg_decompress_struct cinfo;
    error_mgr err;
    const unsigned char *data;
    size_t size;
    int denom, channels, to_end;
    JDIMENSION top, height, left, width;   /* requested; left/width: as libjpeg widened them */
    unsigned char *scratch;                /* one row, for the last row when to_end */
    boolean (*decode_mcu)(j_decompress_ptr, JBLOCKROW *);   /* libjpeg's, when wrapped */
    unsigned long long mcus;               /* MCUs decoded so far (wrapped) */
} job;

#ifdef HAVE_JPEGINT
/* libjpeg's decode_mcu, wrapped: an MCU outside the crop's columns is Huffman-decoded with
 * nowhere to store its coefficients (NULL, as jpeg_skip_scanlines decodes whole rows),
 * where libjpeg would store them and then skip their inverse DCT: the same condition as
 * its one-pass coefficient controller's, on the same MCU column. decode_mcu is called once
 * an MCU in raster order in a single-scan file (the only kind wrapped), which is how the
 * column is known. The stores cost about 5% of the Huffman decoding of the crop's rows. */
static boolean decode_mcu_cropped(j_decompress_ptr c, JBLOCKROW *data) {
    job *j = (job *)c;     /* the cinfo is the job's first member */
    JDIMENSION col = (JDIMENSION)(j->mcus % c->MCUs_per_row);
    if (j->mcus / c->MCUs_per_row != c->input_iMCU_row) {
        /* Not where the count says (no libjpeg known to do this): store everything from
         * here on, as libjpeg alone does. */
        c->entropy->decode_mcu = j->decode_mcu;
        return j->decode_mcu(c, data);
    }
    j->mcus++;
    if (col < c->master->first_iMCU_col || col > c->master->last_iMCU_col)
        data = NULL;
    return j->decode_mcu(c, data);
}
#endif

/* Phase 1 (no GIL): header, scale, start, horizontal crop. Each phase has its own setjmp,
 * so that a longjmp never crosses the GIL's release and reacquisition. */
static int start(job *j) {
    struct jpeg_decompress_struct *c = &j->cinfo;
    if (setjmp(j->err.jump))
        return -1;
    jpeg_mem_src(c, j->data, (unsigned long)j->size);
    jpeg_read_header(c, TRUE);
    if (c->jpeg_color_space != JCS_YCbCr && c->jpeg_color_space != JCS_GRAYSCALE
            && c->jpeg_color_space != JCS_RGB) {
        snprintf(j->err.message, JMSG_LENGTH_MAX, "unsupported colour space %d",
                 (int)c->jpeg_color_space);
        return -1;
    }
    c->scale_num = 1;
    c->scale_denom = (unsigned int)j->denom;
    c->out_color_space = j->channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
    /* The defaults, stated: the accurate integer IDCT and fancy upsampling, as simplejpeg
     * and Pillow decode, so a region has the pixels of the full decode. */
    c->dct_method = JDCT_ISLOW;
    c->do_fancy_upsampling = TRUE;
    jpeg_start_decompress(c);
    /* A progressive file whose scans leave coefficients unrefined (scans missing: a valid
     * file, no warning) is decoded with libjpeg's inter-block smoothing, which differs
     * between libjpeg-turbo versions: left to the whole-image decoder (simplejpeg), so that
     * its pixels are the same with and without this module. The whole file has been read
     * here (a progressive decode buffers every scan). */
    if (c->progressive_mode && c->coef_bits != NULL) {
        for (int ci = 0; ci < c->num_components; ci++)
            for (int k = 0; k < DCTSIZE2; k++)
                if (c->coef_bits[ci][k] != 0) {
                    snprintf(j->err.message, JMSG_LENGTH_MAX,
                             "progressive scans incomplete (component %d, coefficient %d)",
                             ci, k);
                    return -1;
                }
    }
    /* In 64 bits: the caller's values are checked below 2^32, so no sum wraps. */
    if ((unsigned long long)j->top + j->height > c->output_height
            || (unsigned long long)j->left + j->width > c->output_width) {
        snprintf(j->err.message, JMSG_LENGTH_MAX, "region outside the %ux%u image",
                 c->output_height, c->output_width);
        return -1;
    }
    /* Cropping the full width is a no-op that libjpeg may refuse; skip the call then. */
    if (j->width < c->output_width) {
        jpeg_crop_scanline(c, &j->left, &j->width);
#ifdef HAVE_JPEGINT
        /* One scan, one MCU row an iMCU row (interleaved, or one component sampled 1x1):
         * the count of decode_mcu calls gives the MCU's column and row. */
        if (!c->progressive_mode && !c->inputctl->has_multiple_scans
                && (c->comps_in_scan > 1 || c->cur_comp_info[0]->v_samp_factor == 1)) {
            j->decode_mcu = c->entropy->decode_mcu;
            c->entropy->decode_mcu = decode_mcu_cropped;
        }
#endif
    } else {
        j->left = 0, j->width = c->output_width;
    }
    return 0;
}

/* Phase 2 (no GIL): skip to the region, read its rows into out, stop. */
static int rows(job *j, unsigned char *out) {
    struct jpeg_decompress_struct *c = &j->cinfo;
    size_t stride = (size_t)j->width * (size_t)c->output_components;
    if (setjmp(j->err.jump))
        return -1;
    /* jpeg_skip_scanlines may skip fewer rows than asked (at an iMCU boundary): loop. */
    while (c->output_scanline < j->top) {
        JDIMENSION n = jpeg_skip_scanlines(c, j->top - c->output_scanline);
        if (n == 0) {
            snprintf(j->err.message, JMSG_LENGTH_MAX, "cannot skip to row %u", j->top);
            return -1;
        }
    }
    /* Several rows a call: libjpeg hands out a row group at a time (up to 16 rows). */
    while (c->output_scanline < j->top + j->height) {
        JSAMPROW many[16];
        JDIMENSION want = j->top + j->height - c->output_scanline;
        want = want < 16 ? want : 16;
        for (JDIMENSION r = 0; r < want; r++)
            many[r] = out + (size_t)(c->output_scanline + r - j->top) * stride;
        if (jpeg_read_scanlines(c, many, want) == 0) {
            snprintf(j->err.message, JMSG_LENGTH_MAX, "truncated at row %u",
                     c->output_scanline);
            return -1;
        }
    }
    if (!j->to_end) {
        jpeg_abort_decompress(c);   /* the rows below the region are never decoded */
        return 0;
    }
    /* Skipping to the last row Huffman-decodes every row below the region (a skip that
     * reached the end would only set counters); reading that row and finishing reads the
     * file on to its EOI marker: the damage a whole-image decode meets, this one meets. */
    while (c->output_scanline + 1 < c->output_height) {
        JDIMENSION n = jpeg_skip_scanlines(c, c->output_height - 1 - c->output_scanline);
        if (n == 0) {
            snprintf(j->err.message, JMSG_LENGTH_MAX, "cannot skip to the last row");
            return -1;
        }
    }
    if (c->output_scanline < c->output_height) {
        JSAMPROW row = j->scratch;
        if (jpeg_read_scanlines(c, &row, 1) != 1) {
            snprintf(j->err.message, JMSG_LENGTH_MAX, "truncated at row %u",
                     c->output_scanline);
            return -1;
        }
    }
    jpeg_finish_decompress(c);
    return 0;
}

/* Decodes the region into a new bytes object (*out); the job (for its size and left) is
 * returned, to be freed by finish(); NULL with a Python exception. */
static job *region(Py_buffer *buf, int denom, long long top, long long height,
                   long long left, long long width, int channels, int to_end,
                   PyObject **out) {
    int ok;
    job *j;
    *out = NULL;
    if (top < 0 || left < 0 || height < 0 || width < 0 || top > 0xFFFFFFFFLL
            || left > 0xFFFFFFFFLL || height > 0xFFFFFFFFLL || width > 0xFFFFFFFFLL) {
        PyErr_Format(PyExc_ValueError, "region %lld+%lld, %lld+%lld outside any image",
                     top, height, left, width);
        return NULL;
    }
    if (denom != 1 && denom != 2 && denom != 4 && denom != 8) {
        PyErr_Format(PyExc_ValueError, "denom must be 1, 2, 4 or 8, not %d", denom);
        return NULL;
    }
    if (channels != 1 && channels != 3) {
        PyErr_Format(PyExc_ValueError, "channels must be 1 or 3, not %d", channels);
        return NULL;
    }
    if (height == 0 || width == 0) {
        PyErr_Format(PyExc_ValueError, "empty region");
        return NULL;
    }
    j = PyMem_Calloc(1, sizeof(job));
    if (j == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    j->data = buf->buf, j->size = (size_t)buf->len;
    j->denom = denom, j->channels = channels, j->to_end = to_end;
    j->top = (JDIMENSION)top, j->height = (JDIMENSION)height;
    j->left = (JDIMENSION)left, j->width = (JDIMENSION)width;
    j->cinfo.err = jpeg_std_error(&j->err.pub);
    j->err.pub.error_exit = error_exit;
    j->err.pub.emit_message = emit_message;
    jpeg_create_decompress(&j->cinfo);

    Py_BEGIN_ALLOW_THREADS
    ok = start(j);
    Py_END_ALLOW_THREADS
    if (ok == 0) {
        /* The output buffer is a bytes object of the final size: no copy afterwards. */
        *out = PyBytes_FromStringAndSize(
            NULL, (Py_ssize_t)j->height * j->width * j->cinfo.output_components);
        j->scratch = PyMem_Malloc((size_t)j->width * j->cinfo.output_components);
        if (*out == NULL || j->scratch == NULL) {
            if (*out != NULL)
                PyErr_NoMemory();
            Py_CLEAR(*out);
            goto fail;
        }
        Py_BEGIN_ALLOW_THREADS
        ok = rows(j, (unsigned char *)PyBytes_AS_STRING(*out));
        Py_END_ALLOW_THREADS
    }
    if (ok != 0) {
        PyErr_Format(PyExc_ValueError, "cannot decode JPEG region: %s", j->err.message);
        Py_CLEAR(*out);
        goto fail;
    }
    return j;
fail:
    jpeg_destroy_decompress(&j->cinfo);
    PyMem_Free(j->scratch);
    PyMem_Free(j);
    return NULL;
}

static void finish(job *j) {
    jpeg_destroy_decompress(&j->cinfo);    /* frees libjpeg's memory, also after an error */
    PyMem_Free(j->scratch);
    PyMem_Free(j);
}

static PyObject *decode_region(PyObject *self, PyObject *args) {
    Py_buffer buf;
    int denom, channels, to_end = 1;
    long long top, height, left, width;   /* 64 bits: no argument wraps past the checks */
    PyObject *out, *result;
    job *j;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*iLLLLi|p", &buf, &denom, &top, &height, &left, &width,
                          &channels, &to_end))
        return NULL;
    j = region(&buf, denom, top, height, left, width, channels, to_end, &out);
    PyBuffer_Release(&buf);
    if (j == NULL)
        return NULL;
    result = Py_BuildValue("(OIII)", out, j->height, j->width, j->left);
    Py_DECREF(out);
    finish(j);
    return result;
}

static int resize(const unsigned char *src, long long h, long long w, size_t stride, int ch,
                  double y0, double y1, double x0, double x1, long long out_h,
                  long long out_w, long long plan_w, int xoff, int flip, unsigned char *dst);

static PyObject *decode_resize(PyObject *self, PyObject *args) {
    Py_buffer buf;
    int denom, channels, flip = 0;
    long long top, height, left, width, out_h, out_w;
    double y0, y1, x0, x1;
    PyObject *pixels, *out = NULL;
    job *j;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*iLLLLi(dd)(dd)(LL)|p", &buf, &denom, &top, &height, &left,
                          &width, &channels, &y0, &y1, &x0, &x1, &out_h, &out_w, &flip))
        return NULL;
    if (out_h <= 0 || out_w <= 0 || out_h > (1LL << 28) || out_w > (1LL << 28)) {
        PyBuffer_Release(&buf);
        return PyErr_Format(PyExc_ValueError, "output %lld x %lld", out_h, out_w);
    }
    j = region(&buf, denom, top, height, left, width, channels, 1, &pixels);
    PyBuffer_Release(&buf);
    if (j == NULL)
        return NULL;
    out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(out_h * out_w * channels));
    /* The x box is in the coordinates of the asked columns left..left+width; the decoded
     * ones start at j->left <= left (iMCU boundaries): the plan's starts move by the gap. */
    if (out != NULL
            && resize((const unsigned char *)PyBytes_AS_STRING(pixels), j->height, j->width,
                      (size_t)j->width * channels, channels, y0, y1, x0, x1, out_h, out_w,
                      width, (int)(left - j->left), flip,
                      (unsigned char *)PyBytes_AS_STRING(out))
               < 0)
        Py_CLEAR(out);
    Py_DECREF(pixels);
    finish(j);
    return out;
}

/* ------------------------------------------------------------------------------------ */
/* resample: an antialiased bilinear resize (Pillow's triangle filter, support scaled by the
 * reduction, weights normalised per pixel) in 14-bit fixed point, vertical pass first. The
 * weights' float arithmetic and the integer sums are mirrored operation for operation by
 * loadr.decode's numpy twin (setup.py compiles with -ffp-contract=off so that no a*b+c
 * becomes a fused multiply-add that numpy would round differently): the same bytes with
 * and without this module. */

#define PRECISION_BITS 14
#define HALF (1 << (PRECISION_BITS - 1))

typedef struct {
    int out, k;          /* output pixels; taps per output pixel (the most any needs) */
    int *starts;         /* out: the first of the k input pixels each output pixel reads */
    short *weights;      /* out x k, zero past a pixel's own taps (at most 1 << 14) */
} plan;

static void plan_free(plan *p) {
    PyMem_Free(p->starts), PyMem_Free(p->weights);
    p->starts = NULL, p->weights = NULL;
}

/* The weights for resizing [in0, in1) of size pixels to out pixels; 0, or -1 with a Python
 * exception. The same operations in the same order as loadr.decode.resample_weights. */
static int plan_make(plan *p, long long size, double in0, double in1, long long out) {
    p->starts = NULL, p->weights = NULL, p->out = (int)out, p->k = 0;
    if (size <= 0 || out <= 0 || size > (1 << 28) || out > (1 << 28) || !(in0 >= 0.0)
            || !(in1 > in0) || !(in1 <= (double)size)) {
        char message[200];     /* PyErr_Format has no %g */
        snprintf(message, sizeof message, "resample: box %g..%g of %lld pixels to %lld",
                 in0, in1, size, out);
        PyErr_SetString(PyExc_ValueError, message);
        return -1;
    }
    double scale = (in1 - in0) / (double)out;
    double filterscale = scale < 1.0 ? 1.0 : scale;
    double support = 1.0 * filterscale;     /* at most size: the buffers below stay bounded */
    int ksize = (int)ceil(support) * 2 + 1;
    double ss = 1.0 / filterscale;
    double *pre = PyMem_Malloc(sizeof(double) * (size_t)out * ksize);
    int *xmin = PyMem_Malloc(sizeof(int) * (size_t)out), *n = PyMem_Malloc(sizeof(int) * (size_t)out);
    if (pre == NULL || xmin == NULL || n == NULL) {
        PyMem_Free(pre), PyMem_Free(xmin), PyMem_Free(n);
        PyErr_NoMemory();
        return -1;
    }
    int k = 1;
    for (long long xx = 0; xx < out; xx++) {
        double center = in0 + ((double)xx + 0.5) * scale;
        double lo = trunc(center - support + 0.5), hi = trunc(center + support + 0.5);
        int a = lo < 0.0 ? 0 : (int)lo;
        int b = hi > (double)size ? (int)size : (int)hi;
        double ww = 0.0, *w = pre + (size_t)xx * ksize;
        for (int t = 0; t < ksize; t++) {
            double v = 0.0;
            if (t < b - a) {
                v = fabs(((double)(a + t) - center + 0.5) * ss);
                v = v < 1.0 ? 1.0 - v : 0.0;
            }
            w[t] = v;
            ww = ww + v;
        }
        for (int t = 0; t < ksize; t++)
            if (ww != 0.0)
                w[t] = w[t] / ww;
        xmin[xx] = a, n[xx] = b - a > 0 ? b - a : 0;
        k = n[xx] > k ? n[xx] : k;
    }
    p->k = k;
    p->starts = PyMem_Malloc(sizeof(int) * (size_t)out);
    p->weights = PyMem_Calloc((size_t)out * k, sizeof(short));
    if (p->starts == NULL || p->weights == NULL) {
        plan_free(p);
        PyMem_Free(pre), PyMem_Free(xmin), PyMem_Free(n);
        PyErr_NoMemory();
        return -1;
    }
    /* Every pixel reads k pixels: near the right edge the start moves left and the weights
     * right by as much (only zero terms are added), so the loops have a constant count. */
    for (long long xx = 0; xx < out; xx++) {
        int start = xmin[xx] < size - k ? xmin[xx] : (int)(size - k);
        int shift = xmin[xx] - start;
        p->starts[xx] = start;
        for (int t = 0; t < n[xx] && t < ksize; t++)
            p->weights[(size_t)xx * k + shift + t] =
                (short)trunc(0.5 + pre[(size_t)xx * ksize + t] * (double)(1 << PRECISION_BITS));
    }
    PyMem_Free(pre), PyMem_Free(xmin), PyMem_Free(n);
    return 0;
}

static inline unsigned char clip8(int v) {
    v >>= PRECISION_BITS;      /* v > 0: the weights are positive and HALF is added */
    return (unsigned char)(v > 255 ? 255 : v);
}

/* The passes work on blocks of ROWS output rows. The vertical pass writes its rows
 * transposed (t: a column of the block's rows after another, ROWS * ch bytes each), so that
 * the horizontal pass, like the vertical one, sums whole contiguous vectors (one column of
 * ROWS rows per tap) rather than gathering pixels: both inner loops vectorise. */
#define ROWS 8

/* The bytes from one column of the transposed block to the next: ROWS pixels, padded to 32
 * bytes for RGB so that a pixel can be stored as 4 bytes (the fourth lands in the next
 * row's slot, written after it, or in the padding). */
#define COLUMN(ch) ((ch) == 3 ? 32 : ROWS)

/* Bytes from..to of one output row of the vertical pass into line: each value sums its k
 * taps in a register (k a constant in the instances below, so the loop over the row
 * vectorises without an accumulator in memory). */
static inline __attribute__((always_inline)) void vertical_sums(
        unsigned char *restrict line, const unsigned char *restrict src, size_t stride,
        size_t from, size_t to, const short *restrict k, int ky) {
    for (size_t i = from; i < to; i++) {
        int s = HALF;
        for (int tap = 0; tap < ky; tap++)
            s += (short)src[(size_t)tap * stride + i] * k[tap];
        line[i] = clip8(s);
    }
}

/* A row of the vertical pass (line, w pixels; 4 bytes to spare) into its slot t of the
 * transposed block. */
static inline __attribute__((always_inline)) void store_transposed(
        unsigned char *restrict t, const unsigned char *restrict line, long long w, int ch) {
    if (ch == 3) {
        for (long long x = 0; x < w; x++) {
            unsigned int v;
            memcpy(&v, line + (size_t)x * 3, 4);
            memcpy(t + (size_t)x * COLUMN(3), &v, 4);
        }
    } else {
        for (long long x = 0; x < w; x++)
            t[(size_t)x * COLUMN(1)] = line[x];
    }
}

/* One output row of the vertical pass into row r of the transposed block t (t points at
 * that row's slot). */
static inline __attribute__((always_inline)) void vertical_row(
        unsigned char *restrict t, const unsigned char *restrict src, size_t stride,
        unsigned char *restrict line, long long w, int ch, const short *restrict k, int ky) {
    vertical_sums(line, src, stride, 0, (size_t)w * ch, k, ky);
    store_transposed(t, line, w, ch);
}

/* The horizontal pass of one block (rows <= ROWS valid rows of t) into dst; flip: output
 * pixel xx into column out_w - 1 - xx. */
static inline __attribute__((always_inline)) void horizontal_block(
        const unsigned char *restrict t, unsigned char *restrict dst, size_t dst_stride,
        int rows, long long out_w, int ch, const int *restrict starts,
        const short *restrict weights, int k, int flip) {
    /* Every byte of a column, the padding too: whole vectors, no scalar remainder (the
     * padding's sums are never written). */
    const int rc = COLUMN(ch);
    int acc[COLUMN(3)] = {0};   /* set below; zeroed once for gcc's uninitialised-use check */
    for (long long xx = 0; xx < out_w; xx++) {
        const short *restrict kk = weights + (size_t)xx * k;
        const unsigned char *restrict p = t + (size_t)starts[xx] * COLUMN(ch);
        for (int j = 0; j < rc; j++)
            acc[j] = HALF;
        for (int tap = 0; tap < k; tap++) {
            const short kt = kk[tap];
            const unsigned char *restrict q = p + (size_t)tap * COLUMN(ch);
            for (int j = 0; j < rc; j++)
                acc[j] += (short)q[j] * kt;
        }
        const size_t col = (size_t)(flip ? out_w - 1 - xx : xx) * ch;
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < ch; c++)
                dst[(size_t)r * dst_stride + col + c] = clip8(acc[r * ch + c]);
    }
}

typedef void (*vertical_fn)(unsigned char *, const unsigned char *, size_t, unsigned char *,
                            long long, const short *);

/* The portable passes: plain C the compiler vectorises for the baseline ISA (SSE2 on
 * x86-64). Where the CPU has AVX2, the passes below them run instead. */
#define WIDE

#define VERTICAL(CH, K) \
    WIDE static void vertical_##CH##_##K(unsigned char *t, const unsigned char *src, \
            size_t stride, unsigned char *line, long long w, const short *k) { \
        vertical_row(t, src, stride, line, w, CH, k, K); \
    }
VERTICAL(3, 1) VERTICAL(3, 2) VERTICAL(3, 3) VERTICAL(3, 4) VERTICAL(3, 5) VERTICAL(3, 6)
VERTICAL(3, 7) VERTICAL(3, 8)
VERTICAL(1, 1) VERTICAL(1, 2) VERTICAL(1, 3) VERTICAL(1, 4) VERTICAL(1, 5) VERTICAL(1, 6)
VERTICAL(1, 7) VERTICAL(1, 8)

typedef void (*horizontal_fn)(const unsigned char *, unsigned char *, size_t, int, long long,
                              const int *, const short *, int);

#define HORIZONTAL(CH, K) \
    WIDE static void horizontal_##CH##_##K(const unsigned char *t, unsigned char *dst, \
            size_t dst_stride, int rows, long long out_w, const int *starts, \
            const short *weights, int flip) { \
        horizontal_block(t, dst, dst_stride, rows, out_w, CH, starts, weights, K, flip); \
    }
HORIZONTAL(3, 1) HORIZONTAL(3, 2) HORIZONTAL(3, 3) HORIZONTAL(3, 4) HORIZONTAL(3, 5)
HORIZONTAL(3, 6) HORIZONTAL(3, 7) HORIZONTAL(3, 8)
HORIZONTAL(1, 1) HORIZONTAL(1, 2) HORIZONTAL(1, 3) HORIZONTAL(1, 4) HORIZONTAL(1, 5)
HORIZONTAL(1, 6) HORIZONTAL(1, 7) HORIZONTAL(1, 8)

/* The block loop, for ch 1 or 3 as a constant (the two instances below). */
static inline __attribute__((always_inline)) void resize_blocks(
        const unsigned char *src, size_t stride, long long w, int ch, unsigned char *t,
        unsigned char *line, const plan *py, const plan *px, int flip, unsigned char *dst) {
    static const vertical_fn rgb[] = {vertical_3_1, vertical_3_2, vertical_3_3, vertical_3_4,
                                      vertical_3_5, vertical_3_6, vertical_3_7, vertical_3_8};
    static const vertical_fn gray[] = {vertical_1_1, vertical_1_2, vertical_1_3,
                                       vertical_1_4, vertical_1_5, vertical_1_6,
                                       vertical_1_7, vertical_1_8};
    /* The tap count as a constant where it is small (the loop over a row vectorises with
     * the taps unrolled), else as a variable. */
    static const horizontal_fn hrgb[] = {horizontal_3_1, horizontal_3_2, horizontal_3_3,
                                         horizontal_3_4, horizontal_3_5, horizontal_3_6,
                                         horizontal_3_7, horizontal_3_8};
    static const horizontal_fn hgray[] = {horizontal_1_1, horizontal_1_2, horizontal_1_3,
                                          horizontal_1_4, horizontal_1_5, horizontal_1_6,
                                          horizontal_1_7, horizontal_1_8};
    vertical_fn fixed = py->k <= 8 ? (ch == 3 ? rgb : gray)[py->k - 1] : NULL;
    horizontal_fn hfixed = px->k <= 8 ? (ch == 3 ? hrgb : hgray)[px->k - 1] : NULL;
    size_t dst_stride = (size_t)px->out * ch;
    for (int y0 = 0; y0 < py->out; y0 += ROWS) {
        int rows = py->out - y0 < ROWS ? py->out - y0 : ROWS;
        for (int r = 0; r < rows; r++) {
            unsigned char *col = t + (size_t)r * ch;
            const unsigned char *first = src + (size_t)py->starts[y0 + r] * stride;
            const short *k = py->weights + (size_t)(y0 + r) * py->k;
            if (fixed != NULL)
                fixed(col, first, stride, line, w, k);
            else
                vertical_row(col, first, stride, line, w, ch, k, py->k);
        }
        if (hfixed != NULL)
            hfixed(t, dst + (size_t)y0 * dst_stride, dst_stride, rows, px->out, px->starts,
                   px->weights, flip);
        else
            horizontal_block(t, dst + (size_t)y0 * dst_stride, dst_stride, rows, px->out, ch,
                             px->starts, px->weights, px->k, flip);
    }
}

WIDE static void blocks_3(const unsigned char *src, size_t stride, long long w, unsigned char *t,
                     unsigned char *line, const plan *py, const plan *px, int flip,
                     unsigned char *dst) {
    resize_blocks(src, stride, w, 3, t, line, py, px, flip, dst);
}

WIDE static void blocks_1(const unsigned char *src, size_t stride, long long w, unsigned char *t,
                     unsigned char *line, const plan *py, const plan *px, int flip,
                     unsigned char *dst) {
    resize_blocks(src, stride, w, 1, t, line, py, px, flip, dst);
}


/* ------------------------------------------------------------------------------------ */
/* The same passes in AVX2 (x86-64, GCC or clang): two taps a multiply-add (vpmaddwd sums
 * byte pairs times weight pairs into 32 bits), 32 bytes an iteration. The integer sums
 * are the portable passes' exactly (no sum can overflow: 255 times weights that sum to
 * about 1 << 14), so the bytes are the same; tests run both (simd(False)). */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_AVX2 1

#define AVX2 __attribute__((target("avx2")))

/* acc (4 x 8 int32, interleaved as unpack leaves them) += a * w0 + b * w1 for 32 bytes. */
AVX2 static inline void madd32(__m256i acc[4], __m256i a, __m256i b, __m256i w) {
    const __m256i zero = _mm256_setzero_si256();
    __m256i lo = _mm256_unpacklo_epi8(a, b), hi = _mm256_unpackhi_epi8(a, b);
    acc[0] = _mm256_add_epi32(acc[0], _mm256_madd_epi16(_mm256_unpacklo_epi8(lo, zero), w));
    acc[1] = _mm256_add_epi32(acc[1], _mm256_madd_epi16(_mm256_unpackhi_epi8(lo, zero), w));
    acc[2] = _mm256_add_epi32(acc[2], _mm256_madd_epi16(_mm256_unpacklo_epi8(hi, zero), w));
    acc[3] = _mm256_add_epi32(acc[3], _mm256_madd_epi16(_mm256_unpackhi_epi8(hi, zero), w));
}

/* The 32 bytes of madd32's sums, shifted and clipped as clip8, in their original order
 * (the two packs undo the unpacks' interleaving lane by lane). */
AVX2 static inline __m256i pack32(__m256i acc[4]) {
    for (int i = 0; i < 4; i++)
        acc[i] = _mm256_srai_epi32(acc[i], PRECISION_BITS);
    return _mm256_packus_epi16(_mm256_packs_epi32(acc[0], acc[1]),
                               _mm256_packs_epi32(acc[2], acc[3]));
}

AVX2 static inline __m256i pair(short w0, short w1) {
    return _mm256_set1_epi32((int)(unsigned short)w0 | (int)((unsigned)(unsigned short)w1 << 16));
}

/* vertical_row: 32 bytes of the row at a time, the rest as vertical_row sums them. */
AVX2 static void vertical_avx2(unsigned char *restrict t, const unsigned char *restrict src,
                               size_t stride, unsigned char *restrict line, long long w, int ch,
                               const short *restrict k, int ky) {
    const size_t row = (size_t)w * ch;
    const __m256i half = _mm256_set1_epi32(HALF), zero = _mm256_setzero_si256();
    size_t i = 0;
    for (; i + 32 <= row; i += 32) {
        __m256i acc[4] = {half, half, half, half};
        int tap = 0;
        for (; tap + 1 < ky; tap += 2)
            madd32(acc, _mm256_loadu_si256((const __m256i *)(src + (size_t)tap * stride + i)),
                   _mm256_loadu_si256((const __m256i *)(src + (size_t)(tap + 1) * stride + i)),
                   pair(k[tap], k[tap + 1]));
        if (tap < ky)
            madd32(acc, _mm256_loadu_si256((const __m256i *)(src + (size_t)tap * stride + i)),
                   zero, pair(k[tap], 0));
        _mm256_storeu_si256((__m256i *)(line + i), pack32(acc));
    }
    vertical_sums(line, src, stride, i, row, k, ky);     /* the rest of the row */
    store_transposed(t, line, w, ch);
}

/* horizontal_block for RGB: a column of the transposed block is 32 bytes (8 rows of 3, and
 * padding), one madd32 per pair of taps. */
AVX2 static void horizontal_avx2_3(const unsigned char *restrict t, unsigned char *restrict dst,
                                   size_t dst_stride, int rows, long long out_w,
                                   const int *restrict starts, const short *restrict weights,
                                   int k, int flip) {
    const __m256i half = _mm256_set1_epi32(HALF), zero = _mm256_setzero_si256();
    unsigned char o[32];
    for (long long xx = 0; xx < out_w; xx++) {
        const short *kk = weights + (size_t)xx * k;
        const unsigned char *p = t + (size_t)starts[xx] * COLUMN(3);
        __m256i acc[4] = {half, half, half, half};
        int tap = 0;
        for (; tap + 1 < k; tap += 2)
            madd32(acc, _mm256_loadu_si256((const __m256i *)(p + (size_t)tap * COLUMN(3))),
                   _mm256_loadu_si256((const __m256i *)(p + (size_t)(tap + 1) * COLUMN(3))),
                   pair(kk[tap], kk[tap + 1]));
        if (tap < k)
            madd32(acc, _mm256_loadu_si256((const __m256i *)(p + (size_t)tap * COLUMN(3))),
                   zero, pair(kk[tap], 0));
        _mm256_storeu_si256((__m256i *)o, pack32(acc));
        unsigned char *d = dst + (size_t)(flip ? out_w - 1 - xx : xx) * 3;
        for (int r = 0; r < rows; r++)
            memcpy(d + (size_t)r * dst_stride, o + r * 3, 3);
    }
}

/* horizontal_block for L: a column is 8 bytes; a pair of taps is one 16-lane multiply-add. */
AVX2 static void horizontal_avx2_1(const unsigned char *restrict t, unsigned char *restrict dst,
                                   size_t dst_stride, int rows, long long out_w,
                                   const int *restrict starts, const short *restrict weights,
                                   int k, int flip) {
    const __m256i half = _mm256_set1_epi32(HALF);
    const __m128i zero = _mm_setzero_si128();
    unsigned char o[16];
    for (long long xx = 0; xx < out_w; xx++) {
        const short *kk = weights + (size_t)xx * k;
        const unsigned char *p = t + (size_t)starts[xx] * COLUMN(1);
        __m256i acc = half;
        for (int tap = 0; tap < k; tap += 2) {
            __m128i a = _mm_loadl_epi64((const __m128i *)(p + (size_t)tap * COLUMN(1)));
            __m128i b = tap + 1 < k
                ? _mm_loadl_epi64((const __m128i *)(p + (size_t)(tap + 1) * COLUMN(1))) : zero;
            __m256i ab = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(a, b));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(
                ab, pair(kk[tap], tap + 1 < k ? kk[tap + 1] : 0)));
        }
        acc = _mm256_srai_epi32(acc, PRECISION_BITS);
        __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(acc),
                                      _mm256_extracti128_si256(acc, 1));
        _mm_storeu_si128((__m128i *)o, _mm_packus_epi16(w16, w16));
        unsigned char *d = dst + (size_t)(flip ? out_w - 1 - xx : xx);
        for (int r = 0; r < rows; r++)
            d[(size_t)r * dst_stride] = o[r];
    }
}

AVX2 static void blocks_avx2(const unsigned char *src, size_t stride, long long w, int ch,
                             unsigned char *t, unsigned char *line, const plan *py,
                             const plan *px, int flip, unsigned char *dst) {
    size_t dst_stride = (size_t)px->out * ch;
    for (int y0 = 0; y0 < py->out; y0 += ROWS) {
        int rows = py->out - y0 < ROWS ? py->out - y0 : ROWS;
        for (int r = 0; r < rows; r++)
            vertical_avx2(t + (size_t)r * ch, src + (size_t)py->starts[y0 + r] * stride,
                          stride, line, w, ch, py->weights + (size_t)(y0 + r) * py->k, py->k);
        (ch == 3 ? horizontal_avx2_3 : horizontal_avx2_1)(
            t, dst + (size_t)y0 * dst_stride, dst_stride, rows, px->out, px->starts,
            px->weights, px->k, flip);
    }
}
#endif

/* Whether the AVX2 passes run: set when the module loads (the CPU has AVX2), and by
 * simd(False) in tests, which then run the portable ones on the same machine. */
static int use_avx2 = 0;

/* [y0, y1) x [x0, x1) of an h x w x ch image (rows stride bytes apart) resized to out_h x
 * out_w into dst (mirrored left-right if flip), vertical pass first; the x box is in the
 * coordinates of plan_w columns from column xoff. 0, or -1 with a Python exception. */
static int resize(const unsigned char *src, long long h, long long w, size_t stride, int ch,
                  double y0, double y1, double x0, double x1, long long out_h,
                  long long out_w, long long plan_w, int xoff, int flip, unsigned char *dst) {
    plan py, px;
    if (xoff < 0 || (long long)xoff + plan_w > w) {
        PyErr_SetString(PyExc_ValueError, "resample: columns outside the image");
        return -1;
    }
    if (plan_make(&py, h, y0, y1, out_h) < 0)
        return -1;
    if (plan_make(&px, plan_w, x0, x1, out_w) < 0) {
        plan_free(&py);
        return -1;
    }
    /* Zeroed: the rows of a last, partial block are summed too (and never written). */
    unsigned char *t = PyMem_Calloc((size_t)plan_w * COLUMN(ch), 1);
    unsigned char *line = PyMem_Malloc((size_t)plan_w * ch + 4);
    if (t == NULL || line == NULL) {
        PyMem_Free(t), PyMem_Free(line), plan_free(&py), plan_free(&px);
        PyErr_NoMemory();
        return -1;
    }
    /* Only the plan's columns go through the passes (not the ones libjpeg decoded to its
     * left, to an iMCU boundary). */
    Py_BEGIN_ALLOW_THREADS
#ifdef HAVE_AVX2
    if (use_avx2)
        blocks_avx2(src + (size_t)xoff * ch, stride, plan_w, ch, t, line, &py, &px, flip, dst);
    else
#endif
    (ch == 3 ? blocks_3 : blocks_1)(src + (size_t)xoff * ch, stride, plan_w, t, line, &py,
                                    &px, flip, dst);
    Py_END_ALLOW_THREADS
    PyMem_Free(t), PyMem_Free(line), plan_free(&py), plan_free(&px);
    return 0;
}

static PyObject *resample(PyObject *self, PyObject *args) {
    Py_buffer src;
    long long h, w, out_h, out_w;
    int ch;
    double y0, y1, x0, x1;
    PyObject *out = NULL;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*LLi(dd)(dd)(LL)", &src, &h, &w, &ch, &y0, &y1, &x0, &x1,
                          &out_h, &out_w))
        return NULL;
    if ((ch != 1 && ch != 3) || h <= 0 || w <= 0 || h > (1LL << 30) || w > (1LL << 30)
            || src.len != h * w * ch || out_h <= 0 || out_w <= 0 || out_h > (1LL << 28)
            || out_w > (1LL << 28)) {
        PyErr_Format(PyExc_ValueError, "resample: inconsistent sizes");
        goto release;
    }
    out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(out_h * out_w * ch));
    if (out == NULL)
        goto release;
    if (resize(src.buf, h, w, (size_t)w * ch, ch, y0, y1, x0, x1, out_h, out_w, w, 0, 0,
               (unsigned char *)PyBytes_AS_STRING(out)) < 0)
        Py_CLEAR(out);
release:
    PyBuffer_Release(&src);
    return out;
}

static PyObject *weights(PyObject *self, PyObject *args) {
    long long size, out;
    double in0, in1;
    plan p;
    (void)self;
    if (!PyArg_ParseTuple(args, "LddL", &size, &in0, &in1, &out))
        return NULL;
    if (plan_make(&p, size, in0, in1, out) < 0)
        return NULL;
    PyObject *r = Py_BuildValue("(y#y#i)", (const char *)p.starts,
                                (Py_ssize_t)(p.out * sizeof(int)), (const char *)p.weights,
                                (Py_ssize_t)((size_t)p.out * p.k * sizeof(short)), p.k);
    plan_free(&p);
    return r;
}

static PyObject *simd(PyObject *self, PyObject *args) {
    PyObject *on = Py_None;
    int was = use_avx2;
    (void)self;
    if (!PyArg_ParseTuple(args, "|O", &on))
        return NULL;
    if (on != Py_None) {
        int want = PyObject_IsTrue(on);
        if (want < 0)
            return NULL;
#ifdef HAVE_AVX2
        use_avx2 = want && __builtin_cpu_supports("avx2");
#endif
    }
    return PyBool_FromLong(was);
}

static PyMethodDef methods[] = {
    {"decode_region", decode_region, METH_VARARGS,
     "decode_region(data, denom, top, height, left, width, channels) -> (bytes, h, w, x)\n\n"
     "The rows top..top+height and columns x..x+w (x <= left, x+w >= left+width: widened\n"
     "to iMCU boundaries) of a JPEG decoded at 1/denom, as L or RGB (channels 1 or 3)."},
    {"decode_resize", decode_resize, METH_VARARGS,
     "decode_resize(data, denom, top, height, left, width, channels, (y0, y1), (x0, x1),\n"
     "              (out_h, out_w)[, flip]) -> bytes\n\n"
     "decode_region, then resample of its [y0, y1) x [x0, x1) (in the coordinates of the\n"
     "region top..top+height, left..left+width) to out_h x out_w, mirrored left-right\n"
     "if flip."},
    {"resample", resample, METH_VARARGS,
     "resample(src, h, w, channels, (y0, y1), (x0, x1), (out_h, out_w)) -> bytes\n\n"
     "[y0, y1) x [x0, x1) of an h x w x channels uint8 image, antialiased bilinear, resized\n"
     "to out_h x out_w (loadr.decode.resample, whose numpy twin gives the same bytes)."},
    {"simd", simd, METH_VARARGS,
     "simd([on]) -> bool: whether the resize runs its AVX2 passes (the bytes are the same);\n"
     "on: use them where the CPU has AVX2 (the default), or not (the portable passes)."},
    {"weights", weights, METH_VARARGS,
     "weights(size, in0, in1, out) -> (starts, weights, k): resample's int32 plan."},
    {NULL, NULL, 0, NULL}
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "loadr._jpegregion",
    "Region decoding and resampling of JPEGs with the system libjpeg-turbo (loadr.decode).", -1, methods,
    NULL, NULL, NULL, NULL
};

PyMODINIT_FUNC PyInit__jpegregion(void) {
    PyObject *m = PyModule_Create(&module);
#ifdef HAVE_AVX2
    __builtin_cpu_init();
    use_avx2 = __builtin_cpu_supports("avx2");
#endif
    if (m != NULL && PyModule_AddStringConstant(m, "LIBJPEG_TURBO_VERSION",
                                                 Py_STRINGIFY(LIBJPEG_TURBO_VERSION)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
