/* The device-spec grammar against made-up device lists, so every form can be checked whatever
   devices this machine has. */
#include "check.h"
#include "device_spec.h"

#include <string.h>

static clmla_device_info dev(int p, int d, clmla_device_kind kind, const char *platform, const char *vendor,
                             const char *name)
{
    clmla_device_info info;
    memset(&info, 0, sizeof(info));
    info.platform_index = p;
    info.device_index = d;
    info.kind = kind;
    strcpy(info.platform_name, platform);
    strcpy(info.vendor, vendor);
    strcpy(info.name, name);
    return info;
}

static char why[8192];

static void expect(const clmla_device_info *devs, size_t n, const char *spec, const char *env, size_t want)
{
    size_t got = 999;
    clmla_status st = clmla_spec_match(spec, env, devs, n, &got, why, sizeof(why));
    CHECK(st == CLMLA_SUCCESS && got == want, "spec '%s' env '%s': status %d index %zu, expected %zu (%s)",
          spec ? spec : "(null)", env ? env : "(null)", st, got, want, why);
}

static void refuse(const clmla_device_info *devs, size_t n, const char *spec, const char *must_say)
{
    size_t got = 999;
    clmla_status st = clmla_spec_match(spec, NULL, devs, n, &got, why, sizeof(why));
    CHECK(st == CLMLA_ERROR_DEVICE_NOT_FOUND, "spec '%s' gave status %d index %zu", spec, st, got);
    CHECK(got == 999, "spec '%s' wrote an index on failure", spec);
    CHECK(strstr(why, must_say) != NULL, "spec '%s': message lacks '%s': %s", spec, must_say, why);
    /* Every device is listed in the message. */
    for (size_t i = 0; i < n; i++)
        CHECK(strstr(why, devs[i].name) != NULL, "spec '%s': message does not list '%s'", spec, devs[i].name);
}

int main(void)
{
    /* Flat order: CPU first, then two GPUs on a second platform, then an accelerator. */
    clmla_device_info devs[] = {
        dev(0, 0, CLMLA_DEVICE_KIND_CPU, "Portable Computing Language", "AuthenticAMD", "pthread-znver3"),
        dev(1, 0, CLMLA_DEVICE_KIND_GPU, "NVIDIA CUDA", "NVIDIA Corporation", "NVIDIA H100 80GB HBM3"),
        dev(1, 1, CLMLA_DEVICE_KIND_GPU, "NVIDIA CUDA", "NVIDIA Corporation", "NVIDIA L4"),
        dev(2, 0, CLMLA_DEVICE_KIND_ACCELERATOR, "AMD Accelerated Parallel Processing", "Advanced Micro Devices, Inc.",
            "gfx1100:xnack-"),
    };
    size_t n = sizeof(devs) / sizeof(devs[0]);

    /* Default: the first GPU, else the first device; CLMLA_DEVICE (env) when set; argument wins. */
    expect(devs, n, NULL, NULL, 1);
    expect(devs, n, NULL, "", 1);
    expect(devs, n, NULL, "cpu", 0);
    expect(devs, n, "3", "cpu", 3);
    CHECK(clmla_spec_default_index(devs, 1) == 0, "a CPU-only list defaults to device 0");
    clmla_device_info cpu_only[] = {devs[0], devs[3]};
    expect(cpu_only, 2, NULL, NULL, 0);

    /* Flat index and P:D. */
    expect(devs, n, "0", NULL, 0);
    expect(devs, n, "2", NULL, 2);
    expect(devs, n, "1:1", NULL, 2);
    expect(devs, n, "2:0", NULL, 3);
    expect(devs, n, " 1:0 ", NULL, 1);
    /* Types, any case. */
    expect(devs, n, "gpu", NULL, 1);
    expect(devs, n, "CPU", NULL, 0);
    expect(devs, n, "accelerator", NULL, 3);
    /* Substrings of device, vendor and platform names, any case; names may hold a colon. */
    expect(devs, n, "l4", NULL, 2);
    expect(devs, n, "nvidia", NULL, 1);
    expect(devs, n, "pthread", NULL, 0);
    expect(devs, n, "gfx1100", NULL, 3);
    expect(devs, n, "gfx1100:xnack-", NULL, 3);
    expect(devs, n, "Advanced Micro", NULL, 3);
    expect(devs, n, "portable", NULL, 0);

    /* Malformed and unmatched specs: a specific message, every device listed. */
    static const char *const refused[][2] = {
        {"1:", "malformed"},
        {":0", "malformed"},
        {"-1", "malformed"},
        {"+1", "malformed"},
        {"1:2:3", "malformed"},
        {"1x", "malformed"},
        {"99", "no device with that index"},
        {"12345678901234567890", "malformed"},
        {"3:0", "no such platform:device"},
        {"", "empty"},
        {"   ", "empty"},
        {"nosuch", "matches no"},
    };
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++)
        refuse(devs, n, refused[i][0], refused[i][1]);
    refuse(cpu_only, 2, "gpu", "no device of that type");
    {
        size_t got = 0;
        clmla_status st = clmla_spec_match(NULL, "bogus", devs, n, &got, why, sizeof(why));
        CHECK(st == CLMLA_ERROR_DEVICE_NOT_FOUND && strstr(why, "CLMLA_DEVICE"), "a bad CLMLA_DEVICE names the variable: %s", why);
        st = clmla_spec_match("gpu", "bogus", devs, n, &got, why, sizeof(why));
        CHECK(st == CLMLA_SUCCESS && got == 1, "the argument overrides a bad CLMLA_DEVICE");
        st = clmla_spec_match("0", NULL, devs, 0, &got, why, sizeof(why));
        CHECK(st == CLMLA_ERROR_NO_DEVICE, "an empty list is reported as no device");
    }
    return check_summary();
}
