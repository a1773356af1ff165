//! The diesel table definitions, written to match `migrations/` exactly.
#![allow(missing_docs)]

diesel::table! {
    repositories (id) {
        id -> Text,
        url -> Text,
        owner -> Text,
        name -> Text,
        default_branch -> Text,
        clone_url -> Text,
        codehost_id -> Nullable<BigInt>,
        coding_model -> Text,
        review_model -> Text,
        max_turns_coding -> Nullable<Integer>,
        max_turns_review -> Integer,
        agent_type -> Text,
        auto_review -> Bool,
        max_cost_per_task_nanos -> Nullable<BigInt>,
        issues_etag -> Nullable<Text>,
        issues_synced_at -> Nullable<Timestamp>,
        issues_sync_error -> Nullable<Text>,
        issues_watermark -> Nullable<Timestamp>,
        issues_full_synced_at -> Nullable<Timestamp>,
        pulls_etag -> Nullable<Text>,
        pulls_watermark -> Nullable<Timestamp>,
        connected_at -> Timestamp,
        disconnected_at -> Nullable<Timestamp>,
        created_at -> Timestamp,
        updated_at -> Timestamp,
        monthly_budget_nanos -> Nullable<BigInt>,
        egress_allow -> Text,
        max_revisions -> Integer,
        revise_on_agent_review -> Bool,
        allow_provider_tools -> Bool,
    }
}

diesel::table! {
    tasks (id) {
        id -> Text,
        title -> Text,
        prompt -> Text,
        repo_id -> Nullable<Text>,
        repo_url -> Text,
        task_type -> Text,
        state -> Text,
        agent_type -> Text,
        model_used -> Nullable<Text>,
        cost_nanos -> Nullable<BigInt>,
        input_tokens -> BigInt,
        output_tokens -> BigInt,
        pr_url -> Nullable<Text>,
        pr_number -> Nullable<BigInt>,
        issue_number -> Nullable<BigInt>,
        parent_task_id -> Nullable<Text>,
        attempt -> Integer,
        error_message -> Nullable<Text>,
        lease_owner -> Nullable<Text>,
        lease_expires_at -> Nullable<Timestamp>,
        created_at -> Timestamp,
        updated_at -> Timestamp,
        started_at -> Nullable<Timestamp>,
        finished_at -> Nullable<Timestamp>,
        blocked_by -> Nullable<Text>,
        blocked_at -> Nullable<Timestamp>,
        budget_reserve_nanos -> Nullable<BigInt>,
        imported -> Bool,
        revisions -> Integer,
        revision_attempt -> Nullable<Integer>,
        revision_due_at -> Nullable<Timestamp>,
        revision_cost_nanos -> BigInt,
    }
}

diesel::table! {
    issue_links (repo_id, issue_number) {
        repo_id -> Text,
        issue_number -> BigInt,
        task_id -> Text,
        created_at -> Timestamp,
    }
}

diesel::table! {
    task_runs (id) {
        id -> Text,
        task_id -> Text,
        attempt -> Integer,
        agent_type -> Text,
        model -> Nullable<Text>,
        cost_nanos -> Nullable<BigInt>,
        input_tokens -> BigInt,
        cache_read_tokens -> BigInt,
        cache_write_tokens -> BigInt,
        output_tokens -> BigInt,
        turns -> Nullable<Integer>,
        outcome -> Text,
        exit_code -> Nullable<Integer>,
        error_message -> Nullable<Text>,
        started_at -> Timestamp,
        finished_at -> Nullable<Timestamp>,
        sandboxed -> Nullable<Bool>,
        model_calls -> Nullable<BigInt>,
        reported_cost_nanos -> Nullable<BigInt>,
        run_trigger -> Text,
        trigger_url -> Nullable<Text>,
        trigger_author -> Nullable<Text>,
    }
}

diesel::table! {
    revision_feedback (repo_id, source, external_id) {
        repo_id -> Text,
        source -> Text,
        external_id -> Text,
        task_id -> Text,
        pr_number -> BigInt,
        author -> Text,
        body -> Text,
        path -> Nullable<Text>,
        line -> Nullable<BigInt>,
        url -> Text,
        received_at -> Timestamp,
        round_attempt -> Nullable<Integer>,
        outcome -> Text,
    }
}

diesel::table! {
    run_logs (run_id) {
        run_id -> Text,
        task_id -> Text,
        content -> Text,
        truncated -> Bool,
        created_at -> Timestamp,
    }
}

diesel::table! {
    task_events (id) {
        id -> Text,
        task_id -> Text,
        from_state -> Nullable<Text>,
        to_state -> Text,
        reason -> Text,
        at -> Timestamp,
        kind -> Text,
    }
}

diesel::table! {
    secrets (name) {
        name -> Text,
        ciphertext -> Text,
        created_at -> Timestamp,
        updated_at -> Timestamp,
    }
}

diesel::table! {
    api_tokens (id) {
        id -> Text,
        name -> Text,
        role -> Text,
        token_hash -> Text,
        created_at -> Timestamp,
        revoked_at -> Nullable<Timestamp>,
    }
}

diesel::table! {
    synced_issues (repo_id, number) {
        repo_id -> Text,
        number -> BigInt,
        title -> Text,
        body -> Text,
        html_url -> Text,
        author -> Text,
        labels -> Text,
        state -> Text,
        created_at -> Timestamp,
        updated_at -> Timestamp,
        synced_at -> Timestamp,
        linked -> Bool,
    }
}

diesel::table! {
    webhook_deliveries (delivery_id) {
        delivery_id -> Text,
        event -> Text,
        action -> Nullable<Text>,
        received_at -> Timestamp,
    }
}

diesel::table! {
    outbox (id) {
        id -> Text,
        task_id -> Nullable<Text>,
        repo_id -> Text,
        kind -> Text,
        payload -> Text,
        attempts -> Integer,
        next_attempt_at -> Timestamp,
        delivered_at -> Nullable<Timestamp>,
        last_error -> Nullable<Text>,
        created_at -> Timestamp,
    }
}

diesel::table! {
    service_meta (key) {
        key -> Text,
        value -> Text,
        updated_at -> Timestamp,
    }
}

diesel::table! {
    model_calls (id) {
        id -> Text,
        task_id -> Text,
        attempt -> Integer,
        provider -> Text,
        model -> Nullable<Text>,
        status -> Integer,
        outcome -> Text,
        input_tokens -> BigInt,
        cache_read_tokens -> BigInt,
        cache_write_tokens -> BigInt,
        output_tokens -> BigInt,
        reasoning_tokens -> BigInt,
        cost_nanos -> Nullable<BigInt>,
        started_at -> Timestamp,
        duration_ms -> BigInt,
    }
}

diesel::table! {
    egress_blocked (task_id, attempt, host, port) {
        task_id -> Text,
        attempt -> Integer,
        host -> Text,
        port -> Integer,
        count -> BigInt,
        first_at -> Timestamp,
        last_at -> Timestamp,
    }
}

diesel::joinable!(tasks -> repositories (repo_id));
diesel::joinable!(issue_links -> tasks (task_id));
diesel::joinable!(task_runs -> tasks (task_id));
diesel::joinable!(task_events -> tasks (task_id));
diesel::joinable!(revision_feedback -> tasks (task_id));
diesel::joinable!(run_logs -> task_runs (run_id));
diesel::joinable!(synced_issues -> repositories (repo_id));

diesel::allow_tables_to_appear_in_same_query!(
    repositories,
    tasks,
    issue_links,
    task_runs,
    run_logs,
    task_events,
    secrets,
    api_tokens,
    synced_issues,
    webhook_deliveries,
    outbox,
    service_meta,
    cost_daily,
    cost_cumulative,
    instance_budget,
    budget_alerts,
    model_calls,
    egress_blocked,
    run_cost_rollup,
    egress_blocked_repo,
    revision_feedback,
);

diesel::table! {
    cost_daily (day, repo_url) {
        day -> Text,
        repo_url -> Text,
        tasks -> BigInt,
        costed -> BigInt,
        cost_nanos -> BigInt,
    }
}

diesel::table! {
    cost_cumulative (repo_url, task_type, model, day) {
        repo_url -> Text,
        task_type -> Text,
        model -> Text,
        day -> Text,
        tasks -> BigInt,
        costed -> BigInt,
        cost_nanos -> BigInt,
        succeeded -> BigInt,
        input_tokens -> BigInt,
        output_tokens -> BigInt,
        outcome_merged -> BigInt,
        outcome_costed -> BigInt,
        outcome_cost_nanos -> BigInt,
        merged_cost_nanos -> BigInt,
        failed_cost_nanos -> BigInt,
        merged_revisions -> BigInt,
        revision_cost_nanos -> BigInt,
        imported_cost_nanos -> BigInt,
    }
}

diesel::table! {
    report_generation (id) {
        id -> Integer,
        generation -> BigInt,
    }
}

diesel::table! {
    instance_budget (id) {
        id -> Integer,
        monthly_budget_nanos -> Nullable<BigInt>,
        updated_at -> Timestamp,
    }
}

diesel::table! {
    budget_alerts (id) {
        id -> Text,
        budget_key -> Text,
        scope -> Text,
        repo_id -> Nullable<Text>,
        repo_url -> Nullable<Text>,
        month -> Text,
        threshold -> Integer,
        spent_nanos -> BigInt,
        budget_nanos -> BigInt,
        created_at -> Timestamp,
        delivery -> Text,
        attempts -> Integer,
        next_attempt_at -> Timestamp,
        delivered_at -> Nullable<Timestamp>,
        last_error -> Nullable<Text>,
    }
}

diesel::table! {
    run_cost_rollup (month, repo_id, repo_url, task_type, model) {
        month -> Text,
        repo_id -> Text,
        repo_url -> Text,
        task_type -> Text,
        model -> Text,
        cost_nanos -> BigInt,
    }
}

diesel::table! {
    egress_blocked_repo (repo_url) {
        repo_url -> Text,
        count -> BigInt,
    }
}
