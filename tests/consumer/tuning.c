/* The opt-in tuning header, installed beside clmla.h: its declarations compile and link. */
#include <clmla_tuning.h>

#include "consumer.h"

int consumer_tuning(void)
{
    clmla_latent_tuning latent;
    clmla_product_tuning products;
    const char *why = NULL;
    clmla_latent_tuning_defaults(&latent);
    clmla_product_tuning_defaults(&products);
    if (clmla_latent_tuning_check(&latent, &why) != CLMLA_SUCCESS ||
        clmla_product_tuning_check(&products, &why) != CLMLA_SUCCESS) {
        printf("tuning defaults refused: %s\n", why ? why : "?");
        return 1;
    }
    printf("tuning: %d Xgemm parameters, the first %s\n", CLMLA_XGEMM_PARAMETERS, clmla_xgemm_parameter_name(0));
    return 0;
}
