/* test_tolerance.c : the tolerance rule (tests/support/check.c, fc_tol_check)
 * gives the verdict of every case of tests/support/tolerance_cases.txt. The
 * Python tests read the same file for their twin of the rule (check() in
 * tests/python/test_flashc.py), so the two cannot drift apart.
 *
 * The file is found next to this source (__FILE__ is the absolute path CMake
 * compiles it by).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fc_test.h"
#include "support/check.h"

enum { TT_MAX = 8 };

/* "a,b,c" into v (at most TT_MAX); the count, or -1 for "-" (no values). */
static int tt_values(const char *s, double *v) {
    if (strcmp(s, "-") == 0) return -1;
    int n = 0;
    for (const char *p = s; *p && n < TT_MAX; n++) {
        char *end;
        v[n] = strtod(p, &end); /* accepts nan, inf, -inf */
        if (end == p) return 0;
        p = *end == ',' ? end + 1 : end;
    }
    return n;
}

static int tt_dtype(const char *s, flashc_dtype *dt) {
    static const flashc_dtype all[] = {FLASHC_DTYPE_BF16, FLASHC_DTYPE_FP16, FLASHC_DTYPE_FP32};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        if (strcmp(s, flashc_dtype_name(all[i])) == 0) return *dt = all[i], 1;
    return 0;
}

FC_TEST(tolerance_cases) {
    char path[1024];
    snprintf(path, sizeof path, "%s", __FILE__);
    char *slash = strrchr(path, '/');
    snprintf(slash ? slash + 1 : path, sizeof path - (size_t)(slash ? slash + 1 - path : 0),
             "support/tolerance_cases.txt");
    FILE *f = fopen(path, "r");
    if (!f) {
        fc_test_fail(__FILE__, __LINE__, "cannot open %s", path);
        return;
    }
    char line[512];
    int lineno = 0, cases = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        char dts[16], gs[128], rs[128], ls[128];
        int want;
        if (line[0] == '#' || sscanf(line, "%15s %127s %127s %127s %d", dts, gs, rs, ls, &want) != 5)
            continue;
        double got[TT_MAX], ref[TT_MAX], lowp[TT_MAX];
        flashc_dtype dt;
        int n = tt_values(gs, got), nl = tt_values(ls, lowp);
        if (!tt_dtype(dts, &dt) || n <= 0 || tt_values(rs, ref) != n || (nl != -1 && nl != n)) {
            fc_test_fail(__FILE__, __LINE__, "%s:%d: malformed case", path, lineno);
            continue;
        }
        fc_tol_result r = fc_tol_check(dt, got, ref, nl == -1 ? NULL : lowp, n);
        if (r.pass != want)
            fc_test_fail(__FILE__, __LINE__, "%s:%d: fc_tol_check says %s (err %g, tol %g), the case %s",
                         path, lineno, r.pass ? "pass" : "fail", r.err, r.tol,
                         want ? "pass" : "fail");
        cases++;
    }
    fclose(f);
    FC_EXPECT_TRUE(cases >= 20);
}
