/*
 * test_errors.c - status names, categories, version, last-error text.
 */
#include <string.h>

#include "common/harness.h"
#include "sparsek.h"

SK_TEST(errors_status_names_are_their_enum_names) {
    CHECK(strcmp(sk_status_name(SK_STATUS_SUCCESS), "SK_STATUS_SUCCESS") == 0, "%s",
          sk_status_name(SK_STATUS_SUCCESS));
    CHECK(strcmp(sk_status_name(SK_STATUS_BAD_LAYOUT_UNSORTED), "SK_STATUS_BAD_LAYOUT_UNSORTED") == 0,
          "%s", sk_status_name(SK_STATUS_BAD_LAYOUT_UNSORTED));
    CHECK(strcmp(sk_status_name((sk_status)12345), "SK_STATUS_UNKNOWN") == 0, "%s",
          sk_status_name((sk_status)12345));
}

SK_TEST(errors_categories_follow_the_thousands) {
    CHECK(sk_status_get_category(SK_STATUS_SUCCESS) == SK_STATUS_CATEGORY_SUCCESS, "success");
    CHECK(sk_status_get_category(SK_STATUS_BAD_PARAM_SHAPE) == SK_STATUS_CATEGORY_BAD_PARAM, "shape");
    CHECK(sk_status_get_category(SK_STATUS_BAD_LAYOUT_COUNT) == SK_STATUS_CATEGORY_BAD_PARAM, "layout");
    CHECK(sk_status_get_category(SK_STATUS_NOT_SUPPORTED_BACKEND) == SK_STATUS_CATEGORY_NOT_SUPPORTED,
          "backend");
    CHECK(sk_status_get_category(SK_STATUS_INTERNAL_ERROR) == SK_STATUS_CATEGORY_INTERNAL, "internal");
    CHECK(sk_status_get_category(SK_STATUS_EXECUTION_FAILED) == SK_STATUS_CATEGORY_EXECUTION_FAILED,
          "exec");
}

SK_TEST(errors_version_matches_header) {
    CHECK(sk_version() == SK_VERSION, "library %d, header %d", sk_version(), SK_VERSION);
    CHECK(strstr(sk_build_info(), "SparseK") != NULL, "%s", sk_build_info());
}

SK_TEST(errors_last_error_names_the_call_and_clears_on_success) {
    sk_attention_desc desc;
    sk_status st = sk_attention_desc_init(&desc, sizeof desc - 1);
    CHECK(st == SK_STATUS_BAD_PARAM_STRUCT_SIZE, "%s", sk_status_name(st));
    CHECK(strstr(sk_last_error(), "sk_attention_desc_init") != NULL, "%s", sk_last_error());
    CHECK(strstr(sk_last_error(), "struct_size") != NULL, "%s", sk_last_error());
    st = sk_attention_desc_init(&desc, sizeof desc);
    CHECK(st == SK_STATUS_SUCCESS, "%s", sk_status_name(st));
    CHECK(sk_last_error()[0] == '\0', "not cleared: %s", sk_last_error());
}
