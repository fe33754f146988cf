// Prints the node id leading a cluster's KRaft metadata quorum (the active controller), asked
// through Kafka's own Admin API: `java -cp '<broker libs>/*' QuorumLeader.java <bootstrap>`.
import java.util.Properties;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;

public class QuorumLeader {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "30000");
        try (Admin admin = Admin.create(props)) {
            System.out.println(admin.describeMetadataQuorum().quorumInfo().get().leaderId());
        }
    }
}
