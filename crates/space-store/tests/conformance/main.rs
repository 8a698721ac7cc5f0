//! The store conformance suite: every case runs once on SQLite (a file in a temporary
//! directory) and once on PostgreSQL (a throwaway server per case), so the two backends
//! cannot drift apart. PostgreSQL cases skip with a message when no PostgreSQL is
//! installed, unless `SPACE_REQUIRE_POSTGRES` is set.

mod executions;
mod fixture;
mod network;
mod ports;
mod records;
mod templates;
mod workers;

use fixture::Fixture;

macro_rules! conformance {
    ($($module:ident :: $case:ident),+ $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let fixture = super::Fixture::sqlite();
                    super::$module::$case(&fixture).await;
                }
            )+
        }

        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let Some(fixture) = super::Fixture::postgres() else {
                        return;
                    };
                    super::$module::$case(&fixture).await;
                }
            )+
        }
    };
}

conformance!(
    records::migrations_are_idempotent_and_reopening_a_store_keeps_its_data,
    records::every_record_type_round_trips,
    records::duplicate_ids_conflict_and_missing_references_are_not_found,
    records::revoking_an_api_key_is_idempotent_and_keeps_the_first_revocation_time,
    records::worker_state_changes_and_heartbeats_are_stored_and_re_enrolment_keeps_registered_at,
    records::sandbox_state_change_with_a_stale_expected_state_is_refused,
    records::signing_key_state_changes_are_stored,
    records::bundles_never_roll_back,
    records::kv_insert_if_absent_keeps_the_first_value,
    records::standby_sandboxes_are_claimed_oldest_first_once_each_and_only_when_running,
    records::a_claim_takes_only_a_standby_sandbox_of_its_template_and_pools_are_counted_per_worker,
    records::sandbox_limits_round_trip_and_live_sandboxes_are_counted_per_tenant,
    executions::allocate_execution_gives_1_2_3_and_a_failed_execution_keeps_its_number,
    executions::an_execution_id_used_twice_conflicts_and_consumes_no_generation,
    executions::a_stopped_or_missing_sandbox_gets_no_generation,
    executions::execution_state_change_with_a_stale_expected_state_is_refused,
    executions::current_execution_ignores_failed_and_retired_executions,
    executions::executions_on_worker_filters_by_state,
    executions::activation_and_pod_uid_updates_are_stored,
    executions::count_active_by_worker_counts_only_current_executions_of_live_sandboxes,
    executions::two_control_planes_allocating_concurrently_for_one_sandbox_never_share_a_generation,
    workers::enrolling_a_taken_worker_id_needs_the_credential_it_holds,
    workers::update_sequences_start_at_1_only_grow_per_worker_and_survive_reopening,
    workers::two_control_planes_reserving_update_sequences_never_share_one,
    ports::exposing_a_port_again_replaces_it_and_deletes_its_links,
    ports::a_port_of_a_missing_sandbox_or_a_malformed_port_is_refused,
    ports::the_catch_all_record_is_port_0_listed_first_and_goes_with_the_sandboxs_ports,
    ports::ports_are_listed_by_port_and_scoped_to_their_sandbox,
    ports::deleting_a_port_returns_true_once_then_false_and_deletes_its_links,
    ports::deleting_a_sandboxs_ports_leaves_other_sandboxes_ports_and_links,
    ports::a_taken_link_cannot_be_taken_again,
    ports::an_expired_link_is_not_taken_and_is_gone_after,
    ports::two_edges_taking_one_link_at_once_only_one_gets_it,
    ports::purging_links_removes_only_the_expired_ones,
    ports::two_control_planes_exposing_one_port_at_once_see_it_new_only_once,
    records::an_expiry_is_set_and_cleared_on_a_live_sandbox_and_refused_on_a_stopped_one,
    network::a_network_policy_round_trips_through_create_set_network_and_a_reopen,
    network::set_network_is_refused_for_a_stopped_or_missing_sandbox_and_changes_nothing,
    network::a_row_written_without_a_policy_reads_as_none,
    network::a_claim_takes_a_standby_sandbox_of_its_network_mode_and_writes_its_policy,
    templates::a_template_name_is_bound_once_and_the_same_digest_again_changes_nothing,
    templates::templates_are_found_by_digest_under_any_name_listed_by_name_and_removed,
    templates::a_malformed_template_record_is_refused,
    templates::live_sandboxes_pinned_to_a_digest_are_counted_whatever_their_name,
    templates::two_control_planes_binding_one_name_at_once_bind_one_digest,
);
