/* loadr._jpegregion: decode only a region of a JPEG, at a DCT scale.
 *
 * simplejpeg and Pillow decode whole images; a random resized crop keeps about half of
 * one. libjpeg-turbo's partial decompression skips the inverse DCT, upsampling and colour
 * conversion outside the region (jpeg_crop_scanline, jpeg_skip_scanlines) and everything
 * below it (jpeg_abort_decompress before the last row): only the Huffman decoding of the
 * rows above the region and of the full width of its rows stays.
 *
 * decode_region(data, denom, top, height, left, width, channels) -> (bytes, h, w, x)
 *   data: the JPEG (any buffer); denom: 1, 2, 4 or 8 (libjpeg's scale_denom);
 *   top, height, left, width: the region in the coordinates of the image at 1/denom;
 *   channels: 1 (L) or 3 (RGB).
 * Returns the rows top..top+height (exactly) and the columns x..x+w, which cover
 * left..left+width: libjpeg widens a crop to iMCU boundaries, so x <= left.
 * A file libjpeg cannot decode raises ValueError, and so does one it would only warn
 * about (corrupt or truncated data): the caller then decodes it the way it did without
 * this module (simplejpeg stops on warnings too), with the same outcome. Nothing is printed.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <stdio.h>
#include <jpeglib.h>

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
    int denom, channels;
    JDIMENSION top, height, left, width;   /* requested; left/width: as libjpeg widened them */
} job;

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
    if (j->top + j->height > c->output_height || j->left + j->width > c->output_width) {
        snprintf(j->err.message, JMSG_LENGTH_MAX, "region outside the %ux%u image",
                 c->output_height, c->output_width);
        return -1;
    }
    /* Cropping the full width is a no-op that libjpeg may refuse; skip the call then. */
    if (j->width < c->output_width)
        jpeg_crop_scanline(c, &j->left, &j->width);
    else
        j->left = 0, j->width = c->output_width;
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
    while (c->output_scanline < j->top + j->height) {
        JSAMPROW row = out + (size_t)(c->output_scanline - j->top) * stride;
        if (jpeg_read_scanlines(c, &row, 1) != 1) {
            snprintf(j->err.message, JMSG_LENGTH_MAX, "truncated at row %u",
                     c->output_scanline);
            return -1;
        }
    }
    /* The rows below the region are never decoded. */
    jpeg_abort_decompress(c);
    return 0;
}

static PyObject *decode_region(PyObject *self, PyObject *args) {
    Py_buffer buf;
    int denom, channels, ok;
    unsigned int top, height, left, width;
    job *j;
    PyObject *out = NULL, *result = NULL;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*iIIIIi", &buf, &denom, &top, &height, &left, &width,
                          &channels))
        return NULL;
    if (denom != 1 && denom != 2 && denom != 4 && denom != 8) {
        PyBuffer_Release(&buf);
        return PyErr_Format(PyExc_ValueError, "denom must be 1, 2, 4 or 8, not %d", denom);
    }
    if (channels != 1 && channels != 3) {
        PyBuffer_Release(&buf);
        return PyErr_Format(PyExc_ValueError, "channels must be 1 or 3, not %d", channels);
    }
    if (height == 0 || width == 0) {
        PyBuffer_Release(&buf);
        return PyErr_Format(PyExc_ValueError, "empty region");
    }
    j = PyMem_Calloc(1, sizeof(job));
    if (j == NULL) {
        PyBuffer_Release(&buf);
        return PyErr_NoMemory();
    }
    j->data = buf.buf, j->size = (size_t)buf.len;
    j->denom = denom, j->channels = channels;
    j->top = top, j->height = height, j->left = left, j->width = width;
    j->cinfo.err = jpeg_std_error(&j->err.pub);
    j->err.pub.error_exit = error_exit;
    j->err.pub.emit_message = emit_message;
    jpeg_create_decompress(&j->cinfo);

    Py_BEGIN_ALLOW_THREADS
    ok = start(j);
    Py_END_ALLOW_THREADS
    if (ok == 0) {
        /* The output buffer is a bytes object of the final size: no copy afterwards. */
        out = PyBytes_FromStringAndSize(
            NULL, (Py_ssize_t)j->height * j->width * j->cinfo.output_components);
        if (out == NULL)
            goto done;
        Py_BEGIN_ALLOW_THREADS
        ok = rows(j, (unsigned char *)PyBytes_AS_STRING(out));
        Py_END_ALLOW_THREADS
    }
    if (ok != 0) {
        PyErr_Format(PyExc_ValueError, "cannot decode JPEG region: %s", j->err.message);
        goto done;
    }
    result = Py_BuildValue("(OIII)", out, j->height, j->width, j->left);
done:
    Py_XDECREF(out);
    jpeg_destroy_decompress(&j->cinfo);    /* frees libjpeg's memory, also after an error */
    PyMem_Free(j);
    PyBuffer_Release(&buf);
    return result;
}

static PyMethodDef methods[] = {
    {"decode_region", decode_region, METH_VARARGS,
     "decode_region(data, denom, top, height, left, width, channels) -> (bytes, h, w, x)\n\n"
     "The rows top..top+height and columns x..x+w (x <= left, x+w >= left+width: widened\n"
     "to iMCU boundaries) of a JPEG decoded at 1/denom, as L or RGB (channels 1 or 3)."},
    {NULL, NULL, 0, NULL}
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "loadr._jpegregion",
    "Region decoding of JPEGs with the system libjpeg-turbo (loadr.decode).", -1, methods,
    NULL, NULL, NULL, NULL
};

PyMODINIT_FUNC PyInit__jpegregion(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddStringConstant(m, "LIBJPEG_TURBO_VERSION",
                                                 Py_STRINGIFY(LIBJPEG_TURBO_VERSION)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
