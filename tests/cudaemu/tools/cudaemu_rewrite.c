/* tests/cudaemu/tools/cudaemu_rewrite.c: the one source rewrite of the CUDA emulator.
 *
 * usage: cudaemu_rewrite IN OUT [NAME]
 * Copies the .cu / .cuh file IN to OUT, changing two constructs that host C++ cannot
 * express, and emits `#line 1 "NAME"` (default IN) first, keeping every line where it
 * was, so compile errors and __FILE__/__LINE__ name the original file and line:
 *  - `kern<<<grid, block[, smem[, stream]]>>>(args)`, kern an identifier, optionally
 *    qualified (a::b) and with template arguments (k<T, 4>), becomes
 *    `::cudaemu::launch(kern, "kern", __FILE__, __LINE__, ::cudaemu::config(grid, block...))(args)`;
 *  - `__shared__ T name[N]...;` becomes a reference to per-block storage
 *    (cudaemu::static_shared_ref, one instance per block and declaration site), and
 *    `extern __shared__ T name[];` a pointer to the launch's dynamic shared memory.
 * Comments, string and character literals are copied untouched. Refused, with
 * "IN:line: message" on stderr and exit status 1: `<<<` or `__shared__` inside a
 * preprocessor directive, a __shared__ declaration with an initializer or with more
 * than one declarator, and a `<<<` with no kernel name before it. Exit 2: I/O errors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *p;
    size_t n, cap;
} buf;

static void put(buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->p = realloc(b->p, b->cap);
        if (!b->p) {
            perror("cudaemu_rewrite");
            exit(2);
        }
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void puts_(buf *b, const char *s) { put(b, s, strlen(s)); }

static const char *g_in; /* input name, for messages */
static const char *src;  /* the whole input */
static size_t len, pos;
static int line = 1;

static void die(int at_line, const char *msg) {
    fprintf(stderr, "%s:%d: cudaemu_rewrite: %s\n", g_in, at_line, msg);
    exit(1);
}
static int is_id(int c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}
static int is_space(int c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

/* Copy one comment or literal starting at pos to out (or nowhere if out is NULL). */
static int copy_lexeme(buf *out) {
    size_t s = pos;
    if (src[pos] == '/' && src[pos + 1] == '/') {
        while (pos < len && src[pos] != '\n') pos++;
    } else if (src[pos] == '/' && src[pos + 1] == '*') {
        pos += 2;
        while (pos < len && !(src[pos] == '*' && src[pos + 1] == '/')) pos++;
        pos = pos + 2 > len ? len : pos + 2;
    } else if (src[pos] == '"' && pos > 0 && src[pos - 1] == 'R') { /* raw string R"d(...)d" */
        size_t d0 = pos + 1, d1 = d0;
        while (d1 < len && src[d1] != '(') d1++;
        char close[24];
        size_t dl = d1 - d0 < 16 ? d1 - d0 : 16;
        close[0] = ')';
        memcpy(close + 1, src + d0, dl);
        close[dl + 1] = '"';
        close[dl + 2] = 0;
        const char *e = strstr(src + d1, close);
        pos = e ? (size_t)(e - src) + dl + 2 : len;
    } else if (src[pos] == '"' || src[pos] == '\'') {
        const char q = src[pos++];
        while (pos < len && src[pos] != q && src[pos] != '\n') pos += src[pos] == '\\' ? 2 : 1;
        if (pos < len && src[pos] == q) pos++;
    } else {
        return 0;
    }
    if (pos > len) pos = len;
    for (size_t i = s; i < pos; i++) line += src[i] == '\n';
    if (out) put(out, src + s, pos - s);
    return 1;
}

/* Text from pos up to (not including) the terminator at bracket depth 0: ";" or ">>>".
 * Comments are kept; newlines counted. */
static size_t scan_to(const char *term, int start_line) {
    int depth = 0;
    const size_t tl = strlen(term);
    while (pos < len) {
        if (copy_lexeme(NULL)) continue;
        const char c = src[pos];
        if (depth == 0 && !strncmp(src + pos, term, tl)) return pos;
        if (c == '(' || c == '[' || c == '{') depth++;
        if (c == ')' || c == ']' || c == '}') depth--;
        if (c == '\n') line++;
        pos++;
    }
    die(start_line, term[0] == ';' ? "__shared__ declaration without ';'" : "<<< without >>>");
    return 0;
}

static void newlines(buf *out, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] == '\n') put(out, "\n", 1);
}

/* out ends with the kernel expression; pos is at "<<<". */
static void rewrite_launch(buf *out) {
    const int start_line = line;
    size_t e = out->n;
    while (e > 0 && is_space(out->p[e - 1])) e--;
    size_t s = e;
    for (;;) {
        if (s > 0 && out->p[s - 1] == '>') { /* template arguments */
            int d = 0;
            do {
                s--;
                if (out->p[s] == '>') d++;
                if (out->p[s] == '<') d--;
            } while (s > 0 && d > 0);
            while (s > 0 && is_space(out->p[s - 1])) s--;
        }
        while (s > 0 && is_id(out->p[s - 1])) s--;
        if (s >= 2 && out->p[s - 1] == ':' && out->p[s - 2] == ':') {
            s -= 2;
            continue;
        }
        break;
    }
    if (s == e) die(start_line, "<<< without a kernel name before it");
    char *name = malloc(e - s + 1);
    size_t nn = 0, nl = 0;
    for (size_t i = s; i < e; i++) {
        if (out->p[i] == '\n') nl++;
        if (out->p[i] == '"' || out->p[i] == '\\') continue;
        name[nn++] = is_space(out->p[i]) ? ' ' : out->p[i];
    }
    name[nn] = 0;
    out->n = s;
    puts_(out, "::cudaemu::launch(");
    puts_(out, name);
    puts_(out, ", \"");
    puts_(out, name);
    puts_(out, "\", __FILE__, __LINE__, ::cudaemu::config(");
    free(name);
    pos += 3;
    const size_t c0 = pos;
    scan_to(">>>", start_line);
    put(out, src + c0, pos - c0);
    puts_(out, "))");
    for (size_t i = 0; i < nl; i++) puts_(out, "\n");
    pos += 3;
}

/* pos is just past "__shared__"; `dynamic` if "extern" preceded it (already removed). */
static void rewrite_shared(buf *out, int dynamic) {
    const int start_line = line;
    const size_t d0 = pos;
    scan_to(";", start_line);
    const char *d = src + d0;
    size_t n = pos - d0;
    pos++; /* the ';' */
    /* the declarator's name: the identifier before the first '[' at depth 0, else the last one */
    int depth = 0;
    size_t br = n;
    for (size_t i = 0; i < n; i++) {
        const char c = d[i];
        if (c == '[' && depth == 0 && br == n) br = i;
        if (c == '(' || c == '[' || c == '{') depth++;
        else if (c == ')' || c == ']' || c == '}') depth--;
        else if (depth == 0 && c == '=') die(start_line, "__shared__ declaration with an initializer");
        else if (depth == 0 && c == ',') die(start_line, "__shared__ declaration with several names: one per line");
    }
    size_t ne = br;
    while (ne > 0 && !is_id(d[ne - 1])) ne--;
    size_t ns = ne;
    while (ns > 0 && is_id(d[ns - 1])) ns--;
    if (ns == ne) die(start_line, "cannot find the name in this __shared__ declaration");
    char name[128];
    snprintf(name, sizeof name, "%.*s", (int)(ne - ns), d + ns);
    char tname[192];
    snprintf(tname, sizeof tname, "cudaemu_shared_t_%s", name);
    /* typedef <type> cudaemu_shared_t_<name><dims>; then the reference / pointer */
    puts_(out, "typedef ");
    for (size_t i = 0; i < ns; i++) put(out, is_space(d[i]) ? " " : d + i, 1);
    puts_(out, tname);
    for (size_t i = ne; i < n; i++) put(out, is_space(d[i]) ? " " : d + i, 1);
    puts_(out, "; ");
    char tail[1024];
    if (dynamic)
        snprintf(tail, sizeof tail,
                 "::cudaemu::dyn_elem_t<%s> *const %s = (::cudaemu::dyn_elem_t<%s> *)::cudaemu::dynamic_shared();",
                 tname, name, tname);
    else
        snprintf(tail, sizeof tail,
                 "static char cudaemu_site_%s; %s &%s = ::cudaemu::static_shared_ref<%s>(&cudaemu_site_%s, __FILE__, "
                 "__LINE__);",
                 name, tname, name, tname, name);
    puts_(out, tail);
    newlines(out, d, n);
}

static char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        exit(2);
    }
    buf b = {0};
    char tmp[65536];
    size_t r;
    while ((r = fread(tmp, 1, sizeof tmp, f)) > 0) put(&b, tmp, r);
    fclose(f);
    if (!b.p) put(&b, "", 0);
    *n = b.n;
    return b.p;
}

int main(int argc, char **argv) {
    if (argc < 3 || argc > 4) {
        fprintf(stderr, "usage: cudaemu_rewrite IN OUT [NAME]\n");
        return 2;
    }
    g_in = argv[1];
    src = read_all(argv[1], &len);
    buf out = {0};
    puts_(&out, "#line 1 \"");
    for (const char *s = argc == 4 ? argv[3] : argv[1]; *s; s++) {
        if (*s == '"' || *s == '\\') put(&out, "\\", 1);
        put(&out, s, 1);
    }
    puts_(&out, "\"\n");
    int bol = 1; /* only white space since the start of the line */
    while (pos < len) {
        const char c = src[pos];
        if (bol && c == '#') { /* preprocessor directive, with continuations */
            const size_t s = pos;
            const int l0 = line;
            while (pos < len && src[pos] != '\n') {
                if (src[pos] == '\\' && src[pos + 1] == '\n') {
                    pos++;
                    line++;
                } else if (copy_lexeme(NULL)) {
                    continue;
                }
                pos++;
            }
            for (size_t i = s; i + 2 < pos; i++)
                if (!strncmp(src + i, "<<<", 3) || (!strncmp(src + i, "__shared__", 10)))
                    die(l0, "kernel launch or __shared__ inside a preprocessor directive is not rewritten");
            put(&out, src + s, pos - s);
            continue;
        }
        if (copy_lexeme(&out)) {
            bol = 0;
            continue;
        }
        if (c == '\n') {
            line++;
            bol = 1;
            put(&out, &c, 1);
            pos++;
            continue;
        }
        if (!is_space(c)) bol = 0;
        if (c == '<' && !strncmp(src + pos, "<<<", 3)) {
            rewrite_launch(&out);
            continue;
        }
        if (is_id(c) && (pos == 0 || !is_id(src[pos - 1]))) {
            size_t e = pos;
            while (e < len && is_id(src[e])) e++;
            if (e - pos == 10 && !strncmp(src + pos, "__shared__", 10)) {
                size_t t = out.n;
                while (t > 0 && is_space(out.p[t - 1]) && out.p[t - 1] != '\n') t--;
                int dynamic = t >= 6 && !strncmp(out.p + t - 6, "extern", 6) && (t == 6 || !is_id(out.p[t - 7]));
                if (dynamic) out.n = t - 6;
                pos = e;
                rewrite_shared(&out, dynamic);
                continue;
            }
            put(&out, src + pos, e - pos);
            pos = e;
            continue;
        }
        put(&out, &c, 1);
        pos++;
    }
    FILE *f = fopen(argv[2], "wb");
    if (!f || fwrite(out.p, 1, out.n, f) != out.n || fclose(f) != 0) {
        perror(argv[2]);
        return 2;
    }
    return 0;
}
